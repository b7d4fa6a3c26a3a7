# Plots clffn-bench --sweep output: GFLOP/s against tokens, clffn beside the host's BLAS, and, on
# a second panel, the weights read per second beside the device's copy bandwidth (the limit for
# few tokens, where every weight is read once per forward).
#   clffn-bench --sweep --compare-cpu > sweep.csv
#   gnuplot -e "in='sweep.csv'; out='sweep.png'; title='512 -> 2048, relu'" scripts/plot-sweep.gp
if (!exists("in")) in = 'sweep.csv'
if (!exists("out")) out = 'sweep.png'
if (!exists("title")) title = 'clffn forward pass'
set terminal pngcairo size 900,900 font ",11" noenhanced
set output out
set datafile separator ","
set key top left
set logscale x 2
set grid
stats in skip 1 nooutput
cpu = STATS_columns >= 6
set multiplot layout 2,1 title title
set xlabel "tokens (batch x seq)"
set ylabel "GFLOP/s"
if (cpu) {
    plot in using 1:2 skip 1 with linespoints lw 2 pt 7 title "clffn (OpenCL)", \
         in using 1:5 skip 1 with linespoints lw 2 pt 5 title "CPU BLAS (OpenBLAS)"
} else {
    plot in using 1:2 skip 1 with linespoints lw 2 pt 7 title "clffn (OpenCL)"
}
set ylabel "GB/s of weights read"
if (cpu) {
    plot in using 1:3 skip 1 with linespoints lw 2 pt 7 title "clffn (OpenCL)", \
         in using 1:6 skip 1 with linespoints lw 2 pt 5 title "CPU BLAS (OpenBLAS)", \
         in using 1:4 skip 1 with lines lw 2 dt 2 title "device copy bandwidth"
} else {
    plot in using 1:3 skip 1 with linespoints lw 2 pt 7 title "clffn (OpenCL)", \
         in using 1:4 skip 1 with lines lw 2 dt 2 title "device copy bandwidth"
}
unset multiplot
