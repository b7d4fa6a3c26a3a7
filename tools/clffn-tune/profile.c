/* clffn-tune: the device's facts and where its profile lives, the search's progress saved and
 * resumed, and the winners written as the profile the library applies. */
#include "tune.h"
#include "clffn_io.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Progress goes through the atomic writer: an interrupted write leaves the last state. */
void save_state(const char *path, const state *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "phase", s->phase);
    cJSON_AddNumberToObject(o, "index", s->index);
    cJSON_AddNumberToObject(o, "spent_s", s->spent_s);
    if (s->have_xgemm) {
        cJSON_AddItemToObject(o, "xgemm", pset_json(&s->xgemm));
        cJSON_AddNumberToObject(o, "xgemm_s", s->xgemm_s);
    }
    if (s->have_direct) {
        cJSON_AddItemToObject(o, "direct", pset_json(&s->direct));
        cJSON_AddNumberToObject(o, "direct_s", s->direct_s);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (text) {
        const void *parts[1] = {text};
        const size_t lens[1] = {strlen(text)};
        char err[CLFFN_IO_ERR];
        if (clffn_write_atomic(path, parts, lens, 1, err) != 0) {
            fprintf(stderr, "clffn-tune: progress not saved to %s: %s\n", path, err);
        }
    }
    free(text);
}

static void load_state(const char *path, state *s) {
    FILE *f = fopen(path, "rb");
    if (!f) { return; }
    char buf[8192];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *o = cJSON_Parse(buf);
    if (!o) { return; }
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItem(o, "phase"))) { s->phase = v->valueint; }
    if (cJSON_IsNumber(v = cJSON_GetObjectItem(o, "index"))) { s->index = v->valueint; }
    if (cJSON_IsNumber(v = cJSON_GetObjectItem(o, "spent_s"))) { s->spent_s = v->valuedouble; }
    const cJSON *t;
    if ((v = cJSON_GetObjectItem(o, "xgemm")) && pset_from_json(v, &s->xgemm) == 0 &&
        cJSON_IsNumber(t = cJSON_GetObjectItem(o, "xgemm_s"))) {
        s->have_xgemm = 1;
        s->xgemm_s = t->valuedouble;
    }
    if ((v = cJSON_GetObjectItem(o, "direct")) && pset_from_json(v, &s->direct) == 0 &&
        cJSON_IsNumber(t = cJSON_GetObjectItem(o, "direct_s"))) {
        s->have_direct = 1;
        s->direct_s = t->valuedouble;
    }
    cJSON_Delete(o);
}

void show_progress(int tty, double spent_s, double budget, const char *phase, int tried,
                   double best_gflops) {
    if (!tty) { return; }
    const int width = 30, fill = (int)(width * fmin(1.0, spent_s / budget));
    fprintf(stderr, "\r[%.*s%.*s] %3.0f s of %.0f s  %s: %d tried, best %.1f GFLOP/s   ", fill,
            "##############################", width - fill, "..............................",
            spent_s, budget, phase, tried, best_gflops);
    fflush(stderr);
}

/* Opens the device once to learn its names, limits and profile path; the parent only plans,
 * children measure. With print_only, prints the profile instead. Returns -1 to go on. */
int device_facts(search *r, int print_only) {
    clffn_context *cctx = NULL;
    clffn_status cs = clffn_context_create_for_device(r->o.device, &cctx);
    if (cs != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-tune: opening the device: %s\n", clffn_status_string(cs));
        return 1;
    }
    const cl_device_id dev = clffn_context_cl_device(cctx);
    if ((cs = clffn_tuning_profile_path(dev, r->path, sizeof r->path)) != CLFFN_SUCCESS ||
        (cs = clffn_tuning_dir(r->dir, sizeof r->dir)) != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-tune: no place for profiles: %s (set CLFFN_TUNE_DIR)\n",
                clffn_status_string(cs));
        clffn_context_destroy(cctx);
        return 1;
    }
    if (print_only) {
        printf("%s\n", r->path);
        FILE *f = fopen(r->path, "r");
        if (f) {
            int ch;
            while ((ch = fgetc(f)) != EOF) { putchar(ch); }
            fclose(f);
        } else {
            /* the built-in one, whole: saved at the path, a profile to start from */
            const char *builtin = clffn_tuning_builtin_profile(dev);
            printf("(none yet; applied now: %s)\n", clffn_context_tuning(cctx));
            if (builtin && !strncmp(clffn_context_tuning(cctx), "built-in", 8)) {
                printf("%s\n", builtin);
            }
        }
        clffn_context_destroy(cctx);
        return 0;
    }
    snprintf(r->progress, sizeof r->progress, "%s.progress", r->path);
    r->builtin = clffn_tuning_builtin_profile(dev);
    clffn_context_device_name(cctx, r->name, sizeof r->name);
    r->row_group_cols = clffn_context_row_group_cols(cctx);
    cl_device_type type = 0;
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    r->lim.cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof r->lim.max_wg, &r->lim.max_wg, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof r->lim.local_mem, &r->lim.local_mem,
                    NULL);
    cl_platform_id pid;
    clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof pid, &pid, NULL);
    clGetPlatformInfo(pid, CL_PLATFORM_NAME, sizeof r->platform - 1, r->platform, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof r->driver - 1, r->driver, NULL);
    clffn_context_destroy(cctx);
    return -1;
}

/* mkdir -p: every missing folder of dir, as the shell's would. */
int make_dirs(const char *dir) {
    char buf[1024];
    const int n = snprintf(buf, sizeof buf, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof buf) { return -1; }
    for (char *p = buf + 1;; ++p) {
        const char c = *p;
        if (c != '/' && c != '\0') { continue; }
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) { return -1; }
        *p = c;
        if (c == '\0') { break; }
    }
    struct stat st;
    return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* The profile a file at r->path replaces, parsed: that file, else the built-in one, else an
 * empty one (CLBlast's defaults), *from naming which; NULL where the file is there but cannot be
 * read or parsed. */
static cJSON *base_profile(const search *r, const char **from) {
    FILE *f = fopen(r->path, "rb");
    if (!f && errno != ENOENT) { return NULL; }
    if (!f) {
        *from = r->builtin ? "the built-in profile" : "CLBlast's defaults";
        return cJSON_Parse(r->builtin ? r->builtin : "{\"clblast\":{}}");
    }
    *from = "the profile file";
    static char text[1 << 16];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    const int whole = !ferror(f) && feof(f);
    fclose(f);
    text[n] = '\0';
    return whole ? cJSON_Parse(text) : NULL;
}

/* found's keys into the "clffn" section of root (made where it has none): how many changed. */
static int merge_kernels(cJSON *root, const cJSON *found) {
    cJSON *own = cJSON_GetObjectItemCaseSensitive(root, "clffn");
    if (!cJSON_IsObject(own)) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "clffn");
        own = cJSON_AddObjectToObject(root, "clffn");
    }
    int changed = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, found) {
        const cJSON *had = cJSON_GetObjectItemCaseSensitive(own, item->string);
        if (cJSON_IsNumber(had) && had->valuedouble == item->valuedouble) { continue; }
        cJSON_DeleteItemFromObjectCaseSensitive(own, item->string);
        cJSON_AddNumberToObject(own, item->string, item->valuedouble);
        ++changed;
    }
    return changed;
}

int write_kernels_only(const search *r, const kernel_result *kr) {
    const char *from = "";
    cJSON *root = base_profile(r, &from), *found = cJSON_CreateObject();
    if (found) { kernels_json(found, kr); }
    char *line = found ? cJSON_PrintUnformatted(found) : NULL, *text = NULL;
    if (line) { printf("clffn's kernels: %s\n", line); }
    const int changed = root && found ? merge_kernels(root, found) : -1;
    int rc = 1;
    if (!root) {
        fprintf(stderr, "clffn-tune: %s could not be read as a profile; nothing written\n",
                r->path);
    } else if (changed == 0) {
        printf("the profile applied holds them already; nothing written\n");
        rc = 0;
    } else if (changed > 0 && (text = cJSON_Print(root)) != NULL) {
        char err[CLFFN_IO_ERR] = "";
        const void *parts[1] = {text};
        const size_t lens[1] = {strlen(text)};
        rc = clffn_write_atomic(r->path, parts, lens, 1, err) != 0;
        if (rc) {
            fprintf(stderr, "clffn-tune: cannot write %s: %s\n", r->path, err);
        } else {
            printf("clffn's kernels written over %s, its GEMMs' parameters kept (%d value%s "
                   "changed)\nprofile: %s\n%s\n",
                   from, changed, changed == 1 ? "" : "s", r->path, text);
        }
    } else {
        fprintf(stderr, "clffn-tune: out of memory; nothing written\n");
    }
    cJSON_free(text), cJSON_free(line);
    cJSON_Delete(root), cJSON_Delete(found);
    return rc;
}

/* The winners as a profile, written atomically. */
int write_profile(const search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                  const gemv_result *g, const few_result *few, clffn_layout kept,
                  const kernel_result *kr, double after_s, int have_before, double before_s) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "platform", r->platform);
    cJSON_AddStringToObject(root, "device", r->name);
    cJSON_AddStringToObject(root, "driver", r->driver);
    cJSON *shape = cJSON_AddObjectToObject(root, "tuned_for");
    cJSON_AddNumberToObject(shape, "tokens", (double)r->o.T);
    cJSON_AddNumberToObject(shape, "d_model", (double)r->o.D);
    cJSON_AddNumberToObject(shape, "d_ff", (double)r->o.F);
    cJSON_AddBoolToObject(shape, "gated", r->o.gated);
    cJSON_AddNumberToObject(shape, "gemm_gflops", r->flops / after_s * 1e-9);
    if (have_before) {
        cJSON_AddNumberToObject(shape, "gemm_gflops_before", r->flops / before_s * 1e-9);
    }
    const pset routine = routine_set(min_indirect);
    cJSON *k = cJSON_AddObjectToObject(root, "clblast");
    cJSON_AddItemToObject(k, "Xgemm", pset_json(&r->s.xgemm));
    cJSON_AddItemToObject(k, "XgemmDirect", pset_json(&r->s.direct));
    cJSON_AddItemToObject(k, "GemmRoutine", pset_json(&routine));
    if (g->have) {
        cJSON_AddItemToObject(k, "XgemvFast", pset_json(&g->fast));
        cJSON_AddItemToObject(k, "XgemvFastRot", pset_json(&g->rot));
    }
    if (few->rows) {
        cJSON *fk = cJSON_AddObjectToObject(root, "clblast_few_rows");
        cJSON_AddItemToObject(fk, "Xgemm", pset_json(&few->set));
    }
    cJSON *own = cJSON_AddObjectToObject(root, "clffn");
    cJSON_AddNumberToObject(own, "GEMM_K_BLOCK", (double)k_block);
    cJSON_AddNumberToObject(own, "GEMM_K_BLOCK_MIN_ROWS", (double)k_min_rows);
    cJSON_AddNumberToObject(own, "GEMV_MAX_TOKENS", (double)g->max_tokens);
    if (!kr->have) { cJSON_AddNumberToObject(own, "WEIGHT_LAYOUT", (double)kept); }
    if (few->rows) { cJSON_AddNumberToObject(own, "XGEMM_FEW_ROWS", (double)few->rows); }
    kernels_json(own, kr);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char err[CLFFN_IO_ERR] = "out of memory";
    const void *parts[1] = {text};
    const size_t lens[1] = {text ? strlen(text) : 0};
    if (!text || clffn_write_atomic(r->path, parts, lens, 1, err) != 0) {
        fprintf(stderr, "clffn-tune: cannot write %s: %s\n", r->path, err);
        free(text);
        return 1;
    }
    remove(r->progress);
    if (have_before) {
        printf("GEMMs of the FFN: %.1f GFLOP/s before, %.1f GFLOP/s after (%.0f s)\n",
               r->flops / before_s * 1e-9, r->flops / after_s * 1e-9, spent(r));
    }
    printf("direct kernel below m*n*k = %zu^3; K-block %zu from %zu tokens; GEMVs up to %zu "
           "tokens; weights kept %s; a few-tokens Xgemm set below %zu tokens\n",
           min_indirect, k_block, k_min_rows, g->max_tokens,
           layout_text(kr->have ? kr->layout : kept), few->rows);
    if (kr->have) {
        char large[96] = "";
        if (kr->large_weights) {
            snprintf(large, sizeof large, ", %zu in products of %zu weights or more",
                     kr->max_tokens_large, kr->large_weights);
        }
        printf("clffn's kernels up to %zu tokens for f16 and bf16 weights, %zu for q8_0 and "
               "q4_0 (%zu with quantized inputs%s), %zu for f32\n",
               kr->max_tokens, kr->max_tokens_blocks, kr->max_tokens_qx, large, kr->max_tokens_f32);
        if (kr->have_row_group) {
            printf("their rows several to a work-item from inputs of %zu floats\n",
                   kr->row_group_cols);
        }
    }
    printf("profile: %s\n%s\n", r->path, text);
    free(text);
    return 0;
}

const char *layout_text(clffn_layout l) {
    return l == CLFFN_LAYOUT_IN_OUT ? "[in, out]" : "[out, in]";
}

void state_init(state *s, const char *progress_path, int fresh) {
    memset(s, 0, sizeof *s);
    s->phase = 1;
    s->xgemm = xgemm_set();
    s->direct = direct_set();
    if (!fresh) { load_state(progress_path, s); }
    if (s->spent_s > 0) {
        fprintf(stderr, "clffn-tune: resuming phase %d at candidate %d (%.0f s spent)\n", s->phase,
                s->index, s->spent_s);
    }
}
