/* Replays a fuzz corpus through a harness without libFuzzer, so any compiler (gcc in CI) runs
 * the saved inputs as a regression test. Arguments: corpus folders or files. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = nb;
        }
        const size_t got = fread(buf + len, 1, cap - len, f);
        if (got == 0) { break; }
        len += got;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    size_t count = 0;
    for (int i = 1; i < argc; ++i) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: no such path %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (replay_file(argv[i]) != 0) { return 1; }
            ++count;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) { return 1; }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') { continue; }
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (replay_file(path) != 0) {
                closedir(d);
                return 1;
            }
            ++count;
        }
        closedir(d);
    }
    if (count == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    printf("replayed %zu inputs: 0 crashes\n", count);
    return 0;
}
