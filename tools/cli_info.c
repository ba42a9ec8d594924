/* `lowp info [--json]`: what this build of lowp can run on. The version, every registered
 * backend with its devices (name, cores, memory, capability flags), and the LOWP_BACKEND_PATH
 * entries that failed to load, as text or as one JSON object. A backend that fails to answer
 * is reported in place and makes the exit status 1; the rest is still printed. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "lowp/lowp.h"

static const char INFO_USAGE[] =
    "usage: lowp info [--json]\n"
    "  Print the lowp version, the backends and their devices with capabilities,\n"
    "  and LOWP_BACKEND_PATH load errors. --json prints one JSON object.\n";

static void json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", stdout);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

/* "a b c" -> ["a","b","c"] */
static void json_words(const char *s) {
    putchar('[');
    int first = 1;
    while (*s) {
        size_t n = strcspn(s, " ");
        if (n) {
            printf("%s\"%.*s\"", first ? "" : ",", (int) n, s);
            first = 0;
        }
        s += n;
        if (*s) s++;
    }
    putchar(']');
}

static void print_bytes(uint64_t b) {
    if (b == 0)
        fputs("unknown", stdout);
    else if (b >= (1ull << 30))
        printf("%.1f GiB", (double) b / (double) (1ull << 30));
    else
        printf("%.1f MiB", (double) b / (double) (1ull << 20));
}

static void error_line(int json, const char *what, lowp_status st) {
    if (json) {
        fputs("\"error\":", stdout);
        char msg[1200];
        snprintf(msg, sizeof msg, "%s: %s", lowp_status_str(st), lowp_last_error());
        json_string(msg);
    } else {
        printf("    %s failed: %s: %s\n", what, lowp_status_str(st), lowp_last_error());
    }
}

/* One backend; returns 0 when everything it was asked answered. */
static int print_backend(int json, int32_t type) {
    const char *name = "?";
    lowp_backend_name(type, &name);
    int32_t count = 0;
    lowp_status st = lowp_device_count(type, &count);
    if (json) {
        printf("{\"type\":%d,\"name\":", (int) type);
        json_string(name);
        putchar(',');
    } else {
        printf("backend %d \"%s\": ", (int) type, name);
    }
    if (st != LOWP_OK) {
        if (!json) putchar('\n');
        error_line(json, "device count", st);
        if (json) putchar('}');
        return 1;
    }
    if (json)
        printf("\"device_count\":%d,\"devices\":[", (int) count);
    else
        printf("%d device%s\n", (int) count, count == 1 ? "" : "s");

    int failed = 0;
    for (int32_t i = 0; i < count; i++) {
        lowp_caps caps;
        lowp_device dev = {type, i};
        st = lowp_device_caps(dev, &caps);
        char flags[512] = "";
        if (st == LOWP_OK) lowp_caps_describe(&caps, flags, sizeof flags);
        if (json) {
            printf("%s{\"index\":%d,", i ? "," : "", (int) i);
            if (st != LOWP_OK) {
                error_line(json, "caps", st);
            } else {
                fputs("\"name\":", stdout);
                json_string(caps.name);
                printf(",\"cores\":%d,\"mem_bytes\":%llu,\"flags_mask\":%u,\"flags\":",
                       (int) caps.cores, (unsigned long long) caps.mem_bytes,
                       (unsigned) caps.flags);
                json_words(flags);
            }
            putchar('}');
        } else {
            printf("  %s:%d", name, (int) i);
            if (st != LOWP_OK) {
                putchar('\n');
                error_line(json, "caps", st);
            } else {
                printf("  %s\n    cores %d, memory ", caps.name, (int) caps.cores);
                print_bytes(caps.mem_bytes);
                printf("\n    flags: %s\n", flags[0] ? flags : "(none)");
            }
        }
        failed |= st != LOWP_OK;
    }
    if (json) fputs("]}", stdout);
    return failed;
}

typedef struct info_opts {
    int json;
} info_opts;

int lowp_cli_info(int argc, char **argv) {
    static const lowp_cli_opt opts[] = {LOWP_CLI_FLAG("--json", info_opts, json)};
    info_opts o = {0};
    lowp_cli_args args = {"info", INFO_USAGE, opts, 1, &o, {0}, {0}, 0};
    int rc = lowp_cli_parse(&args, argc, argv);
    if (rc >= 0) return rc;
    if (args.npos) return lowp_cli_fail("info", 2, "unknown argument \"%s\"", args.pos[0]);
    const int json = o.json;

    int32_t types[LOWP_DEVICE_MAX_TYPES], n = 0;
    lowp_status st = lowp_backend_list(types, LOWP_DEVICE_MAX_TYPES, &n);
    if (st != LOWP_OK) {
        return lowp_cli_fail("info", 1, "%s: %s", lowp_status_str(st), lowp_last_error());
    }
    const char *env_errors = lowp_backend_env_errors();
    int failed = 0;

    if (json) {
        fputs("{\"version\":", stdout);
        json_string(lowp_version());
        fputs(",\"backends\":[", stdout);
        for (int32_t i = 0; i < n; i++) {
            if (i) putchar(',');
            failed |= print_backend(1, types[i]);
        }
        fputs("],\"backend_path_errors\":[", stdout);
        /* One message per line. */
        const char *p = env_errors;
        int first = 1;
        while (*p) {
            size_t len = strcspn(p, "\n");
            char line[1200];
            snprintf(line, sizeof line, "%.*s", (int) len, p);
            if (!first) putchar(',');
            json_string(line);
            first = 0;
            p += len;
            if (*p) p++;
        }
        fputs("]}\n", stdout);
    } else {
        printf("lowp %s\n", lowp_version());
        for (int32_t i = 0; i < n; i++) failed |= print_backend(0, types[i]);
        if (env_errors[0]) {
            printf("LOWP_BACKEND_PATH load errors:\n");
            const char *p = env_errors;
            while (*p) {
                size_t len = strcspn(p, "\n");
                printf("  %.*s\n", (int) len, p);
                p += len;
                if (*p) p++;
            }
        }
    }
    return failed ? 1 : 0;
}
