/* clffn-tune: CLBlast's parameter sets, sampled and mutated under its constraints
 * (src/tuning/kernels/xgemm.hpp in CLBlast) and the device's limits, and handed to CLBlast. */
#include "tune.h"

#include <clblast_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const XGEMM_NAMES[16] = {"GEMMK", "KREG",  "KWG",   "KWI", "MDIMA", "MDIMC",
                                     "MWG",   "NDIMB", "NDIMC", "NWG", "SA",    "SB",
                                     "STRM",  "STRN",  "VWM",   "VWN"};
static const char *const DIRECT_NAMES[10] = {"KWID", "MDIMAD", "MDIMCD", "NDIMBD", "NDIMCD",
                                             "PADA", "PADB",   "VWMD",   "VWND",   "WGD"};
static const char *const GEMV_FAST_NAMES[] = {"WGS2", "WPT2", "VW2"};
static const char *const GEMV_ROT_NAMES[] = {"WGS3", "WPT3", "VW3"};

pset xgemm_set(void) {
    pset p = {"Xgemm", 16, {0}, {0}};
    for (int i = 0; i < 16; ++i) { p.names[i] = XGEMM_NAMES[i]; }
    return p;
}

pset direct_set(void) {
    pset p = {"XgemmDirect", 10, {0}, {0}};
    for (int i = 0; i < 10; ++i) { p.names[i] = DIRECT_NAMES[i]; }
    return p;
}

static size_t pick(uint64_t *s, const size_t *choices, size_t n) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return choices[(*s >> 33) % n];
}

/* CLBlast's Xgemm constraints (kernel 0) and the device's limits. */
int xgemm_valid(const size_t *v, const limits *lim) {
    if (v[KWG] % v[KWI]) { return 0; }
    if (v[MWG] % (v[MDIMC] * v[VWM]) || v[NWG] % (v[NDIMC] * v[VWN])) { return 0; }
    if (v[MWG] % (v[MDIMA] * v[VWM]) || v[NWG] % (v[NDIMB] * v[VWN])) { return 0; }
    if (v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[MDIMA]) ||
        v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[NDIMB])) {
        return 0;
    }
    if (v[MDIMC] * v[NDIMC] > lim->max_wg) { return 0; }
    const size_t local = 4 * (v[SA] * v[KWG] * v[MWG] + v[SB] * v[KWG] * v[NWG]);
    return (cl_ulong)local <= lim->local_mem;
}

/* A neighbour of `best`: one parameter changed to another allowed value, constraints kept. */
int xgemm_mutate(uint64_t *s, const pset *best, const limits *lim, pset *out) {
    static const size_t wg[] = {16, 32, 64, 128}, kwg[] = {16, 32}, dim[] = {4, 8, 16, 32},
                        kwi[] = {2, 8}, vw[] = {1, 2, 4, 8, 16}, bit[] = {0, 1};
    static const struct {
        int idx;
        const size_t *opts;
        size_t n;
    } knobs[] = {{MWG, wg, 4},    {NWG, wg, 4},    {KWG, kwg, 2},   {MDIMC, dim, 4},
                 {NDIMC, dim, 4}, {MDIMA, dim, 4}, {NDIMB, dim, 4}, {KWI, kwi, 2},
                 {VWM, vw, 5},    {VWN, vw, 5},    {STRM, bit, 2},  {STRN, bit, 2}};
    for (int attempt = 0; attempt < 200; ++attempt) {
        *out = *best;
        const size_t which[2] = {0, 1};
        const int changes = 1 + (int)pick(s, which, 2); /* one or two knobs at a time */
        for (int c = 0; c < changes; ++c) {
            const size_t k =
                (size_t)pick(s, (const size_t[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12);
            out->values[knobs[k].idx] = pick(s, knobs[k].opts, knobs[k].n);
        }
        if (!lim->cpu || (out->values[VWM] <= 16 && out->values[VWN] <= 16)) {
            if ((lim->cpu || (out->values[VWM] <= 8 && out->values[VWN] <= 8)) &&
                xgemm_valid(out->values, lim) &&
                memcmp(out->values, best->values, sizeof best->values) != 0) {
                return 0;
            }
        }
    }
    return -1;
}

/* One random Xgemm set that satisfies CLBlast's constraints and the device's limits. */
pset xgemm_sample(uint64_t *s, const limits *lim) {
    static const size_t wg[] = {16, 32, 64, 128}, kwg[] = {16, 32}, dim[] = {8, 16, 32},
                        kwi[] = {2, 8}, vw[] = {1, 2, 4, 8, 16}, bit[] = {0, 1},
                        k1wg[] = {16, 32, 64}, k1dim[] = {4, 8, 16}, kreg[] = {1, 2, 4};
    pset p = xgemm_set();
    size_t *v = p.values;
    for (;;) {
        /* CLBlast's kernel 1 (GEMMK=1, 2D register tiling) is left out: on POCL, parameter sets
         * that satisfy all of its constraints wrote out of bounds (GEMMK=1 KREG=1 MWG=16 NWG=64
         * MDIMC=8 NDIMC=16 VWM=VWN=1 crashed the process), and candidates run in child
         * processes only so that such a crash costs one candidate, not the search */
        const int k1 = 0;
        v[GEMMK] = (size_t)k1;
        if (!k1) {
            v[MWG] = pick(s, wg, 4), v[NWG] = pick(s, wg, 4), v[KWG] = pick(s, kwg, 2);
            v[MDIMC] = pick(s, dim, 3), v[NDIMC] = pick(s, dim, 3);
            v[MDIMA] = pick(s, dim, 3), v[NDIMB] = pick(s, dim, 3);
            /* 16-wide vectors only where they fill a register (AVX-512 CPUs, some GPUs) */
            v[KWI] = pick(s, kwi, 2), v[VWM] = pick(s, vw, lim->cpu ? 5 : 4);
            v[VWN] = pick(s, vw, lim->cpu ? 5 : 4);
            v[STRM] = pick(s, bit, 2), v[STRN] = pick(s, bit, 2);
            v[SA] = lim->cpu ? 0 : pick(s, bit, 2), v[SB] = lim->cpu ? 0 : pick(s, bit, 2);
            v[KREG] = 1;
        } else {
            v[MWG] = pick(s, k1wg, 3), v[NWG] = pick(s, k1wg, 3), v[KWG] = 1, v[KWI] = 1;
            v[MDIMC] = v[MDIMA] = pick(s, k1dim, 3), v[NDIMC] = v[NDIMB] = pick(s, k1dim, 3);
            v[VWM] = pick(s, vw, 3), v[VWN] = pick(s, vw, 3);
            v[STRM] = v[STRN] = v[SA] = v[SB] = 0, v[KREG] = pick(s, kreg, 3);
        }
        /* CLBlast's constraints */
        if (v[KWG] % v[KWI]) { continue; }
        if (v[MWG] % (v[MDIMC] * v[VWM]) || v[NWG] % (v[NDIMC] * v[VWN])) { continue; }
        if (v[MWG] % (v[MDIMA] * v[VWM]) || v[NWG] % (v[NDIMB] * v[VWN])) { continue; }
        if (!k1 && (v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[MDIMA]) ||
                    v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[NDIMB]))) {
            continue;
        }
        if (k1 && v[KREG] % v[VWN]) { continue; }
        /* the device's limits */
        if (v[MDIMC] * v[NDIMC] > lim->max_wg) { continue; }
        const size_t local = 4 * (v[SA] * v[KWG] * v[MWG] + v[SB] * v[KWG] * v[NWG]);
        if ((cl_ulong)local > lim->local_mem) { continue; }
        return p;
    }
}

pset direct_sample(uint64_t *s, const limits *lim) {
    static const size_t wgd[] = {8, 16, 32, 64}, dim[] = {8, 16, 32}, kwid[] = {2, 8},
                        vw[] = {1, 2, 4, 8}, bit[] = {0, 1};
    pset p = direct_set();
    size_t *v = p.values;
    for (;;) {
        v[WGD] = pick(s, wgd, 4), v[MDIMCD] = pick(s, dim, 3), v[NDIMCD] = pick(s, dim, 3);
        v[MDIMAD] = pick(s, dim, 3), v[NDIMBD] = pick(s, dim, 3), v[KWID] = pick(s, kwid, 2);
        v[VWMD] = pick(s, vw, 4), v[VWND] = pick(s, vw, 4);
        v[PADA] = pick(s, bit, 2), v[PADB] = pick(s, bit, 2);
        if (v[WGD] % v[KWID] || v[WGD] % (v[MDIMCD] * v[VWMD]) || v[WGD] % (v[NDIMCD] * v[VWND]) ||
            v[WGD] % (v[MDIMAD] * v[VWMD]) || v[WGD] % (v[NDIMBD] * v[VWND]) ||
            v[WGD] % ((v[MDIMCD] * v[NDIMCD]) / v[MDIMAD]) ||
            v[WGD] % ((v[MDIMCD] * v[NDIMCD]) / v[NDIMBD])) {
            continue;
        }
        if (v[MDIMCD] * v[NDIMCD] > lim->max_wg) { continue; }
        const size_t local = 4 * (v[WGD] * (v[WGD] + v[PADA]) + v[WGD] * (v[WGD] + v[PADB]));
        if ((cl_ulong)local > lim->local_mem) { continue; }
        return p;
    }
}

pset routine_set(size_t min_indirect) {
    pset p = {"GemmRoutine", 1, {"XGEMM_MIN_INDIRECT_SIZE"}, {min_indirect}};
    return p;
}

int pset_apply(cl_device_id d, const pset *p) {
    if (getenv("CLFFN_TUNE_TRACE")) {
        fprintf(stderr, "%s:", p->kernel);
        for (int i = 0; i < p->n; ++i) { fprintf(stderr, " %s=%zu", p->names[i], p->values[i]); }
        fprintf(stderr, "\n");
    }
    return CLBlastOverrideParameters(d, p->kernel, CLBlastPrecisionSingle, (size_t)p->n,
                                     (const char **)p->names, p->values) == CLBlastSuccess
               ? 0
               : -1;
}

cJSON *pset_json(const pset *p) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < p->n; ++i) {
        cJSON_AddNumberToObject(o, p->names[i], (double)p->values[i]);
    }
    return o;
}

int pset_from_json(const cJSON *o, pset *p) {
    for (int i = 0; i < p->n; ++i) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, p->names[i]);
        if (!cJSON_IsNumber(v)) { return -1; }
        p->values[i] = (size_t)v->valuedouble;
    }
    return 0;
}

void pset_format(const pset *p, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n && n < size; ++i) {
        n += (size_t)snprintf(buf + n, size - n, "%s%zu", i ? "," : "", p->values[i]);
    }
}

int pset_parse(const char *text, pset *p) {
    const char *c = text;
    for (int i = 0; i < p->n; ++i) {
        char *end;
        p->values[i] = strtoul(c, &end, 10);
        if (end == c || (i + 1 < p->n && *end != ',')) { return -1; }
        c = end + 1;
    }
    return 0;
}

void gemv_sets(pset *fast, pset *rot) {
    *fast = (pset){"XgemvFast", 3, {0}, {0}};
    *rot = (pset){"XgemvFastRot", 3, {0}, {0}};
    for (int i = 0; i < 3; ++i) {
        fast->names[i] = GEMV_FAST_NAMES[i];
        rot->names[i] = GEMV_ROT_NAMES[i];
    }
}
