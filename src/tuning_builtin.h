/* Built-in tuning profiles (included by tuning.c): what clffn-tune found, applied on devices
 * that have no profile file of their own: POCL on AVX-512 and AVX2 CPUs and NVIDIA's H100 and
 * H200.
 *
 * POCL on AVX-512 x86-64: `CLFFN_NO_TUNING=1 clffn-tune --budget 600` on 2026-11-21 on the CI
 * machine (2 cores of a Xeon, "pthread-skylake-avx512"), FFN 640 tokens, 512 -> 2048: the two
 * GEMMs at 23.6 GFLOP/s against 7.4 with CLBlast's defaults in the same run (docs/PERFORMANCE.md
 * has the forward pass). It is applied to every AVX-512 family LLVM names, since they share the
 * vector width that decides these parameters (VWM 16). AVX2 machines have a profile of their
 * own (below).
 * GEMM_K_BLOCK 256: clffn-bench --k-block 0 against 256 on the same machine, 2026-11-22: the
 * forward 1.2-1.9x and the backward 1.2-1.8x faster on the three compute-bound shapes of
 * docs/PERFORMANCE.md; 192, 384 and 512 were no better in one process (clffn-bench-gemms).
 * Xgemv: a sweep of its parameters on 4096 -> 11008 at one token, 2026-11-22.
 * XgemvFast 16/16/16 and XgemvFastRot 8/2/2: `clffn-bench-gemms --gemv-sweep` (every work-group
 * size, work per item and vector width with size x work <= 256) on the seed shape and on
 * 4096 -> 11008 gated, 2026-11-22 on the AMD EPYC host: one token's four GEMVs on the seed shape
 * 2.72 -> 0.38 ms (XgemvFast, 64/4/4 before) and 2.82 -> 1.18 ms (XgemvFastRot, 16/8/4 before),
 * on the decoding shape 86 -> 65 and 125 -> 58 ms. Each is the fastest or within 15% of it on
 * both shapes (docs/PERFORMANCE.md).
 * XGEMM_MIN_INDIRECT_SIZE 1 (was 102, found before K-blocking): every product on the tiled
 * kernel; with 256-long K-blocks the direct kernel took GEMM 2 up to 8 tokens and ran it 2-4x
 * slower (clffn-bench --gemv-max 0 at 2, 4, 8, 16 tokens, one sitting).
 * The two Xgemm sets, 2026-11-22 on the AMD EPYC host with the weights kept [in, out] then, where
 * nothing is transposed per call (CLBlast still runs the backward's weight gradients, and
 * products where a context's crossovers send them): the tokens are padded to the tile's NWG, so
 * few tokens want a narrow tile and many a wide one: two Xgemm sets, the search's 128 x 32 (KWG 32)
 * and, below XGEMM_FEW_ROWS 128 tokens, 128 x 8 (NDIMC 1, NDIMB 1, MDIMA 4, KWG 64; the forward at
 * 8 tokens 1.5-1.9 -> 0.45-0.8 ms against 128 x 32). One 128 x 8 tile for everything made the
 * BERT and SwiGLU shapes 2-29% slower forward and 3-20% backward in three alternated rounds;
 * the two sets against it, three more: the large shapes' backwards faster in eight of nine, the
 * forwards in six; the tiles tie at 64 and 128 tokens on the seed shape (docs/PERFORMANCE.md).
 * GEMV_MAX_TOKENS 1 (was 2): at 1 token the GEMVs win forward and backward on both shapes; at
 * 2, with the GEMV parameters above, they win the seed shape but lose the decoding shape's
 * forward (55 against 44 ms), the case this crossover is for.
 * The WGEMV shapes: clffn-tune's phase 9 on 4096 -> 11008 and 1024 -> 2816 gated, 2026-11-23
 * on the AMD EPYC host; the shapes tie at one token (row work-groups of 4 to 16 rows, column
 * strips of 32 to 128 within 5%), so the defaults stay. Compressed weights through clffn's
 * kernels beat dequantized blocks through SGEMM at every count up to 16 there (q4_0 at 16
 * tokens 60 against 206 ms, f16 74 against 240 ms on the larger shape).
 * KERNEL_MAX_TOKENS_QX 1073741824 (every count): inputs rounded to q8_0 multiply in integers and
 * convert no weights, 2026-11-26 on the AMD EPYC host, clffn-bench --kernel-max against 16,
 * 4096 -> 11008 SwiGLU, forward: 640 tokens q8_0 283 against 1262 ms, q4_0 277 against 1173,
 * bf16 479 against 1148; 2048 tokens 1424 against 4443, 802 against 4199, 1575 against 5033.
 * KERNEL_MAX_TOKENS, KERNEL_MAX_TOKENS_LARGE and KERNEL_MAX_TOKENS_F32 1073741824 (every count),
 * WEIGHT_LAYOUT 0 ([out, in]), as on Intel's cores (below). These were 128, 256, 4 and [in, out]
 * (measured 2026-11-25/26) until the row kernels' direct sums (cl/weights.cl's CLFFN_ROW_DIRECT)
 * and prefetches; since, on the AMD EPYC host (2026-11-28, two alternated rounds, the profile
 * before against --kernel-max 100000, with --weight-layout out_in for f32, forward, ms), the
 * kernels are ahead on every shape but the smallest. Compressed: 4096 -> 11008 SwiGLU at 384
 * tokens f16 832-849 -> 439-498, at 640 q8_0 1321-1510 -> 814-847, q4_0 1260-1495 -> 802-809;
 * 1024 -> 2816 at 512 f16 67.6-71.6 -> 39.6-46.5, at 2048 q8_0 202-210 -> 163-171; 512 -> 2048
 * at 640 f16 16.6-17.7 -> 14.0-14.7, q4_0 16.2-17.1 -> 12.6-13.6; 768 -> 3072 GELU at 2048 bf16
 * 112-114 -> 99-108; the 8-expert 1024 -> 2816 layer (its experts on clffn's kernels; its
 * counts read back once, as past 16 tokens every layer's are) at 512
 * tokens f16 148-173 -> 80-83, at 2048 q8_0 501-505 -> 340-357. f32: 4096 -> 11008 at 8 tokens
 * 24.0-25.1 -> 20.6-21.6 (backward 301-305 -> 139-147), at 64 249-259 -> 88.6-89.5 (backward
 * 538-567 -> 362-377), at 256 907-958 -> 320-390, at 640 1245-1275 -> 948-955; 1024 -> 2816 at
 * 128 18.8-19.0 -> 11.1-11.7, at 2048 216-217 -> 205; 768 -> 3072 GELU at 2048 120-124 ->
 * 112-115. The seed shape (512 -> 2048) at 8 tokens 0.34-0.47 -> 0.32-0.39, level at 16, behind
 * at 64 (1.42-1.53 -> 1.67-1.75, its backward 4.5-4.9 -> 2.8-3.1) and at 640 by up to a fifth in
 * one pair of rounds (13.8-15.6 -> 16.3-17.8), level in another (15.1-15.9 with CLBlast over
 * [out, in], 15.3-15.9). The backwards past 16 tokens run the same products either way.
 * clffn-tune's phase 9 found the same on that host (its kernels ahead at every count measured,
 * [out, in]). */
// clang-format off: the JSON stays in the lines clffn-tune printed
#define CLFFN_POCL_AVX512_HEAD                                                                    \
    "{\"clblast\":{"                                                                              \
    "\"Xgemm\":{\"GEMMK\":0,\"KREG\":1,\"KWG\":32,\"KWI\":8,\"MDIMA\":8,\"MDIMC\":4,\"MWG\":128," \
    "\"NDIMB\":4,\"NDIMC\":4,\"NWG\":32,\"SA\":0,\"SB\":0,\"STRM\":0,\"STRN\":1,\"VWM\":16,"      \
    "\"VWN\":8},"                                                                                 \
    "\"XgemmDirect\":{\"KWID\":2,\"MDIMAD\":8,\"MDIMCD\":8,\"NDIMBD\":16,\"NDIMCD\":16,\"PADA\":" \
    "0,"                                                                                          \
    "\"PADB\":1,\"VWMD\":1,\"VWND\":1,\"WGD\":64},"                                               \
    "\"GemmRoutine\":{\"XGEMM_MIN_INDIRECT_SIZE\":1},"                                            \
    "\"Xgemv\":{\"WGS1\":128,\"WPT1\":2},"                                                        \
    "\"XgemvFast\":{\"WGS2\":16,\"WPT2\":16,\"VW2\":16},"                                         \
    "\"XgemvFastRot\":{\"WGS3\":8,\"WPT3\":2,\"VW3\":2}},"                                        \
    "\"clblast_few_rows\":{"                                                                      \
    "\"Xgemm\":{\"GEMMK\":0,\"KREG\":1,\"KWG\":64,\"KWI\":8,\"MDIMA\":4,\"MDIMC\":4,\"MWG\":128," \
    "\"NDIMB\":1,\"NDIMC\":1,\"NWG\":8,\"SA\":0,\"SB\":0,\"STRM\":0,\"STRN\":1,\"VWM\":16,"       \
    "\"VWN\":8}},"                                                                                \
    "\"clffn\":{\"GEMM_K_BLOCK\":256,\"GEMM_K_BLOCK_MIN_ROWS\":512,\"GEMV_MAX_TOKENS\":1,"        \
    "\"XGEMM_FEW_ROWS\":128,"
#define CLFFN_POCL_AVX512_TAIL                                                                 \
    "\"KERNEL_LARGE_WEIGHTS\":45088768,\"KERNEL_MAX_TOKENS_QX\":1073741824,"                   \
    "\"WGEMV_ROW_SPLIT\":1,\"WGEMV_ROW_ROWS\":8,\"WGEMV_COL_WIDTH\":64,\"WGEMV_COL_SPLIT\":1," \
    "\"WGEMV_COL_GROUPS\":4"

/* The same on AMD's cores, whose one stream a core read faster than four where x fits the
 * first-level cache, and on Intel's, whose four streams read faster. The row kernels group rows
 * from 1024 floats of x there (2026-11-27, Intel Xeon, 2 cores, alternated rounds, the profile
 * before against it): 4096 -> 11008 SwiGLU at one token in f16 13.4-13.5 -> 9.9-10.3 ms, q8_0
 * 8.7-8.9 -> 6.3-6.8, bf16 11.5-12.0 -> 10.1-10.6; 2048 -> 5632 at 2 tokens in f16 1.9-2.1 ->
 * 1.5-1.6; 1024 -> 2816 at 1 and 4 tokens and Qwen3's 128-expert layer level or faster. From
 * 512 floats since (same host, three rounds, --row-group-cols 512 against 1024 alternated):
 * Qwen3's layer at one token in f16 2.01-2.27 -> 1.81-1.91 ms, its experts' second products
 * (rows of 768 values) 12-17% less device time; in q8_0, and the 512 -> 2048, 768 -> 3072 and
 * 2048 -> 768 FFNs at 1-2 tokens, level within the host's spread.
 * KERNEL_MAX_TOKENS and KERNEL_MAX_TOKENS_LARGE 1073741824 (every count) on Intel's (AMD's since,
 * above), first 512: dequantized SGEMM runs at about half the EPYC's rate there
 * (118 GFLOP/s on 4096 -> 11008 at 512 tokens), and the row kernels in passes (16-wide direct sums,
 * rows walked once a part of 8 tokens: cl/weights.cl's CLFFN_ROW_DIRECT) stay ahead of it to 512
 * tokens on every shape measured (the same host, --kernel-max 0 against 1024, best of 3, ms): at
 * 512 tokens 4096 -> 11008 f16 1173.9 against 741.3, q4_0 1063.8 against 655.9; 2048 -> 5632 f16
 * 270.8 against 192.3, q8_0 261.2 against 172.7; 1024 -> 2816 f16 65.3 against 50.6, q8_0 60.2
 * against 50.5; 512 -> 2048 f16 24.1 against 21.3, q8_0 level (21.8 against 22.0); at 384 512 ->
 * 2048 17.3 against 15.2 and 1024 -> 2816 46.6 against 36.6. Past 512 the smallest shape turns (512
 * -> 2048 at 768 tokens: q4_0 31.1 against 33.4) where 1024 -> 2816 does not (f16 89.9 against
 * 72.5). Every count since the f32 forward runs the row kernels too (below), which left the
 * dequantized products at up to 1.25x f32's time at 2048 tokens: the kernels in passes ran ahead of
 * them past 512 on every shape measured, forward, the backward level (the same host, later, two
 * alternated rounds, --kernel-max 100000 against the profile, best of 2-5, ms): 1024 -> 2816 at 768
 * tokens f16 65-74 against 82-87, q8_0 61 against 82-87; 768 -> 3072 GELU at 2048 f16 103-112
 * against 123-137, q4_0 93 against 127-132; 4096 -> 11008 at 1024 f16 1165-1234 against 2055-2180,
 * q8_0 1270-1274 against 2164-2209; 512 -> 2048 at 4096 q8_0 86 against 108-112, f16 101-109
 * against 108-112, at 768 q4_0 16.5-19.8 against 18.9-19.9; the 8-expert 1024 -> 2816 layer at 2048
 * tokens (its experts on clffn's kernels, the counts read back) f16 369-392 against 521-523,
 * q8_0 334-364 against 498-530, level at 512.
 * WEIGHT_LAYOUT 0 ([out, in]) and KERNEL_MAX_TOKENS_F32 1073741824 (every count) on Intel's (AMD's
 * since, above): CLBlast's f32 products below 512 rows (where they take no K-blocks) ran
 * at 30-45 GFLOP/s on 4096 -> 11008 there, and the row kernels over f32 weights kept [out, in],
 * in passes past 16 tokens, ran 1.2-6x faster from 8 tokens to 512 (2026-11-27, Intel Xeon, 2
 * cores, two alternated rounds, the profile before against --weight-layout out_in --kernel-max
 * 512, forward, ms): 4096 -> 11008 SwiGLU at 8 tokens 71.1-71.3 -> 22.7-23.0, 16 156-159 ->
 * 34-37, 64 631-653 -> 104, 256 1511-1635 -> 394-405, 512 1131-1161 -> 736-779; 1024 -> 2816 at
 * 128 27.2-27.3 -> 12.4-14.1; 512 -> 2048 at 128 4.7-5.0 -> 3.0-3.6; one and two tokens level,
 * the backward level or faster, the seed shape at 8 tokens 0.48-0.53 -> 0.56-0.58 ms. Past 512
 * tokens the kernels stayed level or ahead too (the same host, --kernel-max 100000 against 512,
 * two rounds): the seed shape at 640 tokens 15.3-16.3 against 17.1-18.5 ms (16.1-17.0 with the
 * profile before; CLBlast multiplies weights kept [out, in] transposed, copying them each call),
 * at 4096 level; 768 -> 3072 GELU at 2048 tokens 123-126 against 141-143; 1024 -> 2816 at 2048
 * 216-220 against 245-266, at 640 67 against 82-87; 4096 -> 11008 at 640 930 against 1438-1527;
 * the backwards (CLBlast's weight gradients, clffn's strips for dx) level, within 5%. The strips
 * over weights kept [in, out] with the kernels to 512 tokens ran 1.4-2x slower than the rows and
 * behind CLBlast on 512 -> 2048 (docs/PERFORMANCE.md, "f32 weights on the Intel host"). */
#define CLFFN_POCL_AVX512_EVERY_COUNT                               \
    "\"WEIGHT_LAYOUT\":0,\"KERNEL_MAX_TOKENS_F32\":1073741824,"     \
    "\"KERNEL_MAX_TOKENS\":1073741824,\"KERNEL_MAX_TOKENS_LARGE\":" \
    "1073741824,"
#define CLFFN_POCL_AVX512_PROFILE \
    CLFFN_POCL_AVX512_HEAD CLFFN_POCL_AVX512_EVERY_COUNT CLFFN_POCL_AVX512_TAIL "}}"
#define CLFFN_POCL_AVX512_INTEL_PROFILE                                         \
    CLFFN_POCL_AVX512_HEAD CLFFN_POCL_AVX512_EVERY_COUNT CLFFN_POCL_AVX512_TAIL \
        ",\"WGEMV_ROW_GROUP_COLS\":512}}"

/* The many-rows Xgemm set of the AVX2 profile below, which llvmpipe's takes too. */
#define CLFFN_POCL_AVX2_XGEMM                                                                     \
    "\"Xgemm\":{\"GEMMK\":0,\"KREG\":1,\"KWG\":16,\"KWI\":8,\"MDIMA\":8,\"MDIMC\":8,\"MWG\":128," \
    "\"NDIMB\":8,\"NDIMC\":8,\"NWG\":64,\"SA\":0,\"SB\":0,\"STRM\":0,\"STRN\":0,\"VWM\":16,"      \
    "\"VWN\":8},"

/* POCL on AVX2 x86-64 (256-bit vectors, no AVX-512: Haswell to Alder Lake, Zen 1-3):
 * `CLFFN_NO_TUNING=1 clffn-tune --budget 600` on 2026-12-02 on the CI machine (2 cores of an AMD
 * EPYC, Zen 3, which POCL names "pthread-haswell-AMD EPYC"; clffn-bench's copy 13-19 GB/s), FFN
 * 640 tokens, 512 -> 2048: the GEMMs 9.0 -> 39.9 GFLOP/s. Its crossovers as it measured them: the
 * kernels for f32 at every count with the weights kept [out, in] (ahead of CLBlast from 1 token to
 * 1024 on 512 -> 2048), for compressed weights to 192 tokens (48 with quantized inputs, measured
 * before q4_0's AVX2 16-row form; with it, 192, below) there and at every count in products of
 * 4096 -> 11008's size. Against no profile, the same host, two alternated rounds, ms forward
 * (backward): the seed shape 522-566 (713-949) -> 44-54 (110-126); 4096 -> 11008 SwiGLU at one
 * token f32 156-166 (488-533) -> 40-45 (165-173), f16, bf16, q8_0 and q4_0 level (the same kernels
 * either way); at 16 tokens f32 857-870 (2103-2188) -> 98-123 (273-346), q8_0 976-1195 (929-1093)
 * -> 49-57 (120-135); 1024 -> 2816 at 64 tokens f16 239-263 -> 20; 768 -> 3072 GELU at 2048 tokens
 * f32 1768-2013 (3813-3857) -> 422-531 (946-983) (docs/PERFORMANCE.md, "POCL on AVX2"). Measured
 * on AMD's cores only; applied to every AVX2 family LLVM names, as the AVX-512 profile is to its
 * family, because the vector width decides the GEMMs' tiles and no profile left them 4.4x slower.
 * With quantized inputs the kernels (q4_0's in its 16-row form) beat the dequantized SGEMM to 192
 * tokens on 512 -> 2048 (q8_0 there 15.9 against 19.8 ms, 30.2 against 25.2 at 384) and to 384 at
 * least on 4096 -> 11008 SwiGLU (q4_0 643 against 1600 ms, q8_0 914 against 1682). The
 * compressed crossovers below the large products' were measured again on the same host, one run
 * of each count, the kernels against dequantized SGEMM (docs/PERFORMANCE.md, "The crossovers by
 * type on AVX2"): q8_0 and q4_0 with f32 inputs ahead at every count to 1024 tokens on 512 ->
 * 2048, 1024 -> 2816 SwiGLU and 2048 -> 768 SwiGLU (KERNEL_MAX_TOKENS_BLOCKS: every count); f16
 * and bf16 ahead at 256 but for one bf16 run within 6%, level at 320 and behind at 384 (256). */
#define CLFFN_POCL_AVX2_PROFILE                                                                   \
    "{\"clblast\":{" CLFFN_POCL_AVX2_XGEMM                                                        \
    "\"XgemmDirect\":{\"KWID\":8,\"MDIMAD\":8,\"MDIMCD\":16,\"NDIMBD\":16,\"NDIMCD\":8,"          \
    "\"PADA\":0,\"PADB\":0,\"VWMD\":4,\"VWND\":4,\"WGD\":64},"                                    \
    "\"GemmRoutine\":{\"XGEMM_MIN_INDIRECT_SIZE\":204},"                                          \
    "\"XgemvFast\":{\"WGS2\":16,\"WPT2\":16,\"VW2\":16},"                                         \
    "\"XgemvFastRot\":{\"WGS3\":8,\"WPT3\":2,\"VW3\":2}},"                                        \
    "\"clblast_few_rows\":{"                                                                      \
    "\"Xgemm\":{\"GEMMK\":0,\"KREG\":1,\"KWG\":16,\"KWI\":8,\"MDIMA\":8,\"MDIMC\":8,\"MWG\":128," \
    "\"NDIMB\":1,\"NDIMC\":1,\"NWG\":8,\"SA\":0,\"SB\":0,\"STRM\":0,\"STRN\":0,\"VWM\":16,"       \
    "\"VWN\":8}},"                                                                                \
    "\"clffn\":{\"GEMM_K_BLOCK\":256,\"GEMM_K_BLOCK_MIN_ROWS\":640,\"GEMV_MAX_TOKENS\":1,"        \
    "\"XGEMM_FEW_ROWS\":33,\"WGEMV_ROW_SPLIT\":1,\"WGEMV_ROW_ROWS\":4,\"WGEMV_COL_WIDTH\":64,"    \
    "\"WGEMV_COL_SPLIT\":1,\"WGEMV_COL_GROUPS\":4,\"KERNEL_MAX_TOKENS\":256,"                     \
    "\"KERNEL_MAX_TOKENS_QX\":192,\"KERNEL_MAX_TOKENS_F32\":1073741824,\"WEIGHT_LAYOUT\":0,"      \
    "\"WGEMV_ROW_GROUP_COLS\":4097,\"KERNEL_MAX_TOKENS_LARGE\":1073741824,"                       \
    "\"KERNEL_MAX_TOKENS_BLOCKS\":1073741824,\"KERNEL_LARGE_WEIGHTS\":45088768}}"

/* Mesa's llvmpipe through rusticl (Mesa 22.3.6, LLVM 15, "256 bits"), the OpenCL of a machine
 * without a GPU driver, as in a container's CI: CLBlast's defaults for it ran every product of
 * the seed shape through its direct kernel at 0.3 GFLOP/s. The tiled kernel from 204^3 with the
 * AVX2 profile's Xgemm set (clffn-tune's best after its first candidates there; llvmpipe's
 * vectors are as wide). On 2026-12-02 on the CI machine (2 cores of an AMD EPYC, Zen 3),
 * against no profile, two alternated rounds, ms forward (backward): the seed shape 9281-9288
 * (17606-19327) -> 1059-1321 (2047-2203); 64 tokens of 512 -> 2048 847-996 (1818-2101) ->
 * 115-147 (288-291); 130 tokens of 256 -> 1024 SwiGLU 735-771 (1466-1482) -> 139-156 (252-293);
 * one token of 1024 -> 4096 level (docs/PERFORMANCE.md, "Mesa's llvmpipe"). The direct kernel's
 * parameters stay CLBlast's: the AVX2 profile's two 64-wide tiles take all of llvmpipe's 32 KiB
 * of local memory, which CLBlast refuses. Products below 204^3 and clffn's own kernels are as
 * without a profile. */
#define CLFFN_LLVMPIPE_PROFILE \
    "{\"clblast\":{" CLFFN_POCL_AVX2_XGEMM "\"GemmRoutine\":{\"XGEMM_MIN_INDIRECT_SIZE\":204}}}"

/* NVIDIA H100 through NVIDIA's OpenCL driver (580.159.04, "NVIDIA CUDA" platform):
 * `clffn-tune --budget 210 --tokens 4096 --d-model 768 --d-ff 3072` on 2026-11-22 on an H100 80GB
 * HBM3 (CLBlast's database has no H100 and falls back to its generic NVIDIA parameters): the
 * FFN's GEMMs at that shape at 23.3 TFLOP/s against 20.5 with CLBlast's parameters in the
 * search's own check. Its XgemmDirect set is left out (CLBlast's own stays): with it the seed
 * shape (640 tokens, 512 -> 2048, below the crossover) ran 10% slower than with no profile, and a
 * search on that shape found nothing better than CLBlast's parameters. Forwards in one sitting,
 * no profile against this one (docs/PERFORMANCE.md, "NVIDIA H100"): BERT shape 28.6 -> 34.6
 * TFLOP/s, SwiGLU 29.0 -> 33.8, one decoding token 1.12 -> 0.75 ms, the seed shape 11.0 -> 10.6
 * (4% slower; with no profile it measured 10.5-11.0 over five sittings). No K-blocks (every
 * block was slower than none on the GPU); the direct kernel below m·n·k = 1691^3 (it beat the
 * tiled one up to 1024 tokens on the BERT shape); GEMVs for one token only (0.24 against 0.61 ms
 * for the SGEMM there; at 2 tokens the SGEMM won in the search on the seed shape).
 * WEIGHT_LAYOUT 1 ([in, out]), XgemvFast 32/1/1 and XgemvFastRot 16/16/8: `clffn-bench-gemms
 * --gemv-sweep` on 4096 -> 11008 gated at one token, then three alternated rounds against the
 * profile before (weights [out, in], XgemvFast 256/1/1, XgemvFastRot 16/16/16), same H100 and
 * driver, 2026-11-22: with the weights kept [in, out] one token's forward runs XgemvFast, which
 * reads consecutive weights across a warp, 0.74-0.76 -> 0.42-0.43 ms (1.25 TB/s of weights;
 * PyTorch 0.22 ms); its backward 1.15-1.17 -> 1.29-1.31 ms; forwards of the BERT and SwiGLU shapes
 * 2-5% faster, the seed shape and the backwards within 2% (docs/PERFORMANCE.md, "NVIDIA H100").
 * GEMVs for 2 tokens too would make that forward 1.08 -> 0.81 ms but its backward 1.69 -> 2.41,
 * so the crossover stays 1. clffn's own kernels (2026-11-24, same H100 and driver, `clffn-tune
 * --eval --kernels` children on 4096 -> 11008 gated): the row kernel with 32 lanes a row
 * interleaved by eight values and the column kernel in row chunks that fill the GPU; of eight
 * shapes none beat 32/4 (rows) and 8/16/8 (columns) by more than 3% at one token, and these won
 * at 2 to 16 tokens. They beat CLBlast through 16 tokens with f32 weights (one token 0.22 against
 * 0.43 ms, the GEMV; 8 tokens 0.50 against 1.17, the SGEMM) and the dequantized SGEMMs through
 * 16 with compressed ones (q4_0: 0.12 against 2.0 ms at one token, 1.5 against 2.2 at 16), so
 * KERNEL_MAX_TOKENS and KERNEL_MAX_TOKENS_F32 are 16. The H200's few-rows Xgemm set (below) and
 * its crossover to the direct kernel at 768^3 (2026-11-27, same H100 and driver, forwards
 * alternated with the profile before in one sitting): 640 tokens of 512 -> 2048 (the seed shape)
 * 0.249 -> 0.225 ms, 1024 tokens 0.329 -> 0.250, 2048 tokens 0.593 -> 0.395; 768 -> 3072 at 512,
 * 1024 and 2048 tokens 0.371 -> 0.294, 0.672 -> 0.471, 1.266 -> 0.746; 128 tokens 3-7% faster;
 * the BERT and SwiGLU shapes level. KERNEL_MAX_TOKENS 12 since the dequantizer stages its
 * transposed tiles in local memory (same sitting, `clffn-tune --eval --kernels` children on 4096
 * -> 11008 gated, clffn-tune's rule): the dequantized SGEMMs took 0.79 ms at one token and 1.47
 * at 16, where the kernels took 1.91 in f16 (q8_0 1.72, q4_0 1.71); at 12 they won by a hair in
 * f16 (1.45 against 1.46) and by 9% in q8_0 and q4_0, at 8 clearly (f16 0.81 against 1.44).
 * With inputs rounded to q8_0 or bf16 they won through 16 (q8_0 1.38 against 1.48), so
 * KERNEL_MAX_TOKENS_QX 16. Applied to every H100 (PCIe, SXM, NVL: one chip, SM 9.0). */
#define CLFFN_NVIDIA_HOPPER_PROFILE(kmax)                                                          \
    "{\"clblast\":{"                                                                               \
    "\"Xgemm\":{\"GEMMK\":0,\"KREG\":1,\"KWG\":16,\"KWI\":2,\"MDIMA\":16,\"MDIMC\":16,\"MWG\":64," \
    "\"NDIMB\":16,\"NDIMC\":8,\"NWG\":128,\"SA\":1,\"SB\":1,\"STRM\":1,\"STRN\":1,\"VWM\":4,"      \
    "\"VWN\":4},"                                                                                  \
    "\"GemmRoutine\":{\"XGEMM_MIN_INDIRECT_SIZE\":768},"                                           \
    "\"XgemvFast\":{\"WGS2\":32,\"WPT2\":1,\"VW2\":1},"                                            \
    "\"XgemvFastRot\":{\"WGS3\":16,\"WPT3\":16,\"VW3\":8}},"                                       \
    "\"clblast_few_rows\":{"                                                                       \
    "\"Xgemm\":{\"GEMMK\":0,\"KREG\":1,\"KWG\":32,\"KWI\":2,\"MDIMA\":16,\"MDIMC\":16,\"MWG\":64," \
    "\"NDIMB\":16,\"NDIMC\":16,\"NWG\":64,\"SA\":1,\"SB\":1,\"STRM\":0,\"STRN\":1,\"VWM\":4,"      \
    "\"VWN\":4}},"                                                                                 \
    "\"clffn\":{\"GEMM_K_BLOCK\":0,\"GEMV_MAX_TOKENS\":1,\"WEIGHT_LAYOUT\":1,"                     \
    "\"XGEMM_FEW_ROWS\":2048,\"KERNEL_MAX_TOKENS\":" #kmax ",\"KERNEL_MAX_TOKENS_QX\":16,"         \
    "\"KERNEL_MAX_TOKENS_F32\":16,\"WGEMV_ROW_SPLIT\":32,\"WGEMV_ROW_ROWS\":4,"                    \
    "\"WGEMV_COL_WIDTH\":8,\"WGEMV_COL_SPLIT\":16,\"WGEMV_COL_GROUPS\":8}}"

#define CLFFN_NVIDIA_H100_PROFILE CLFFN_NVIDIA_HOPPER_PROFILE(12)

/* NVIDIA H200 (the H100's chip, 132 SMs, with HBM3e; NVIDIA's driver 580.159.04): the H100's
 * profile as it was then, which on 2026-11-26 made every shape measured there faster than no
 * profile (one decoding token 0.60 -> 0.18 ms, BERT 1.32 -> 1.12, SwiGLU 1.19 -> 1.00;
 * docs/PERFORMANCE.md, "NVIDIA H200"), with two changes from the same sitting. A few-rows Xgemm
 * set below 2048 tokens, the best of `clffn-tune --tokens 640 --d-model 512 --d-ff 2048` (the seed
 * shape; 64 x 64 tiles, 32-deep K steps), and the direct kernel below m·n·k = 768^3 instead of
 * 1691^3: the H100 set's 64 x 128 tiles leave the seed shape's second product 40 work-groups for
 * 132 SMs, so the direct kernel ran those shapes. Forwards against the H100 profile, 64-2048
 * tokens on 512 -> 2048 and 768 -> 3072: the seed shape 0.242 -> 0.200-0.204 ms (backward 0.445 ->
 * 0.336), 1024 tokens of 768 -> 3072 0.69 -> 0.46, 2048 tokens of 512 -> 2048 0.585 -> 0.390;
 * level or faster at 64-384 tokens of 512 -> 2048 and level at the BERT and SwiGLU shapes. Those
 * two changes then made the H100 faster too (above), so the two chips share one profile but for
 * KERNEL_MAX_TOKENS: 8 on the H200 (2026-11-27, same H200 and driver, `clffn-tune --eval
 * --kernels` children on 4096 -> 11008 gated, clffn-tune's rule). There the dequantized SGEMMs
 * with the local tiles took 1.40 ms at 12 tokens, where q4_0's kernels took 1.69 (f16 kept
 * [in, out] 1.404 against 1.398); at 8 the kernels won clearly (q4_0 0.60 against 1.38, f16
 * 0.76 against 1.43). */
#define CLFFN_NVIDIA_H200_PROFILE CLFFN_NVIDIA_HOPPER_PROFILE(8)
// clang-format on

static const builtin_profile builtin_profiles[] = {
    {"NVIDIA CUDA", "H100", CLFFN_NVIDIA_H100_PROFILE},
    {"NVIDIA CUDA", "H200", CLFFN_NVIDIA_H200_PROFILE},
    /* POCL names an AMD EPYC with AVX-512 "pthread-skylake-avx512-AMD EPYC …" too */
    {"Portable Computing Language", "avx512-AMD", CLFFN_POCL_AVX512_PROFILE},
    {"Portable Computing Language", "avx512", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "cascadelake", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "cooperlake", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "icelake", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "tigerlake", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "rocketlake", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "sapphirerapids", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "emeraldrapids", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "graniterapids", CLFFN_POCL_AVX512_INTEL_PROFILE},
    {"Portable Computing Language", "znver4", CLFFN_POCL_AVX512_PROFILE},
    {"Portable Computing Language", "znver5", CLFFN_POCL_AVX512_PROFILE},
    /* after the AVX-512 names: "skylake" is in "skylake-avx512" too */
    {"Portable Computing Language", "haswell", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "broadwell", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "skylake", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "alderlake", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "raptorlake", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "znver1", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "znver2", CLFFN_POCL_AVX2_PROFILE},
    {"Portable Computing Language", "znver3", CLFFN_POCL_AVX2_PROFILE},
    {"rusticl", "llvmpipe", CLFFN_LLVMPIPE_PROFILE},
};
