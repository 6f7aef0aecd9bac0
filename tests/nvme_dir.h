/* A temporary directory for an NVMe-tier test, and the check that the engines left nothing
   in it (each engine removes its own files at destroy). Include after zero.h (its
   implementation declares mkdtemp). */
#ifndef ZERO_TESTS_NVME_DIR_H
#define ZERO_TESTS_NVME_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes /tmp/zero-test-<prefix>-XXXXXX into buf (n bytes); the path, or NULL on failure. */
static const char *nd_make_dir(char *buf, size_t n, const char *prefix)
{
    snprintf(buf, n, "/tmp/zero-test-%s-XXXXXX", prefix);
    return mkdtemp(buf);
}

/* 1 when dir exists and holds no entry but . and .. */
static int nd_dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d) return 0;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n == 0;
}

#endif
