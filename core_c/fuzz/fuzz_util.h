/* fuzz_util.h — helpers shared by the libFuzzer targets in core_c/fuzz/.
 *
 * The container targets work on a scratch copy of a real, tiny container:
 * every file of the original is symlinked into a fresh temporary directory,
 * except the files the target rewrites for each input, which are copied.
 * Nothing here is part of the core; it is compiled only into the fuzzers. */
#ifndef FERRY_FUZZ_UTIL_H
#define FERRY_FUZZ_UTIL_H

#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static __attribute__((unused)) void fz_die(const char *what, const char *path) {
    fprintf(stderr, "fuzz setup: %s %s: %s\n", what, path ? path : "", strerror(errno));
    abort();
}

/* Copy src to dst byte for byte. */
static __attribute__((unused)) void fz_copy_file(const char *src, const char *dst) {
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0) fz_die("cannot copy", src);
    char buf[65536];
    ssize_t got;
    while ((got = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)got) != got) fz_die("cannot write", dst);
    close(in);
    close(out);
}

/* Mirror directory src into dst: subdirectories are made, files listed in
 * `copy` (relative names, NULL-terminated) are copied, the rest symlinked.
 * manifest.json is never mirrored when skip_manifest is set. */
static __attribute__((unused)) void fz_mirror(const char *src, const char *dst, const char *rel, const char *const *copy,
                      int skip_manifest) {
    char sdir[4096], ddir[4096];
    snprintf(sdir, sizeof sdir, "%s%s%s", src, *rel ? "/" : "", rel);
    snprintf(ddir, sizeof ddir, "%s%s%s", dst, *rel ? "/" : "", rel);
    if (*rel && mkdir(ddir, 0700) != 0 && errno != EEXIST) fz_die("cannot make", ddir);
    DIR *d = opendir(sdir);
    if (!d) fz_die("cannot list", sdir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char r[4096], s[8192], t[8192];
        snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(s, sizeof s, "%s/%s", src, r);
        snprintf(t, sizeof t, "%s/%s", dst, r);
        struct stat st;
        if (stat(s, &st) != 0) fz_die("cannot stat", s);
        if (S_ISDIR(st.st_mode)) { fz_mirror(src, dst, r, copy, skip_manifest); continue; }
        if (skip_manifest && !strcmp(r, "manifest.json")) continue;
        int is_copy = 0;
        for (const char *const *c = copy; c && *c; c++) is_copy |= !strcmp(*c, r);
        char abs_s[8192];
        if (!realpath(s, abs_s)) fz_die("cannot resolve", s);
        if (is_copy) fz_copy_file(abs_s, t);
        else if (symlink(abs_s, t) != 0) fz_die("cannot link", t);
    }
    closedir(d);
}

/* A fresh scratch directory under $TMPDIR (or /tmp). */
static __attribute__((unused)) void fz_scratch(char *out, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    snprintf(out, cap, "%s/ferry-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(out)) fz_die("cannot make a scratch directory in", out);
}

static __attribute__((unused)) void fz_write_file(const char *path, const uint8_t *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fz_die("cannot open", path);
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0) fz_die("cannot write", path);
        done += (size_t)n;
    }
    close(fd);
}

/* The i-th (0-based) ':'-separated entry of the environment variable, or NULL. */
static __attribute__((unused)) const char *fz_env_item(const char *var, int i, char *out, size_t cap) {
    const char *v = getenv(var);
    if (!v) return NULL;
    while (i-- > 0) {
        v = strchr(v, ':');
        if (!v) return NULL;
        v++;
    }
    size_t n = strcspn(v, ":");
    if (n == 0 || n >= cap) return NULL;
    memcpy(out, v, n);
    out[n] = '\0';
    return out;
}

/* Remove a scratch directory made by fz_scratch + fz_mirror (two levels). */
static __attribute__((unused)) void fz_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) fz_remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

#endif
