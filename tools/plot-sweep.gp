# Plots clffn-bench --sweep output: GFLOP/s against tokens, clffn beside the host's BLAS.
#   clffn-bench --sweep --compare-cpu > sweep.csv
#   gnuplot -e "in='sweep.csv'; out='sweep.png'; title='640 x 512 -> 2048, relu'" tools/plot-sweep.gp
if (!exists("in")) in = 'sweep.csv'
if (!exists("out")) out = 'sweep.png'
if (!exists("title")) title = 'clffn forward pass'
set terminal pngcairo size 900,560 font ",11" noenhanced
set output out
set datafile separator ","
set key autotitle columnhead top left
set logscale x 2
set xlabel "tokens (batch x seq)"
set ylabel "GFLOP/s"
set title title
set grid
stats in skip 1 nooutput
cols = STATS_columns
plot in using 1:2 with linespoints lw 2 pt 7 title "clffn (OpenCL)", \
     for [c=3:cols] in using 1:c with linespoints lw 2 pt 5 title "CPU BLAS (OpenBLAS)"
