/* Fused window gather for PretrainTokenStreamDataset.get_batch: token windows -> int64 x and y, one pass.
 *
 * numpy needs two passes for a batch (a fancy-index gather of the (B, T+1) windows in the token dtype,
 * then a cast into int64 x and y); here every token is read once and written straight as int64:
 *
 *     x[i, j] = src[rows[i] + j],  y[i, j] = src[rows[i] + j + 1]    for i < B, j < T
 *
 * with x at out[0 : B*T] and y at out[B*T : 2*B*T] (the (2, B, T) buffer the reader returns halves of).
 * The loops are plain C that gcc -O3 vectorizes (a widening load and a store per vector); software
 * prefetches hide the misses of random windows (see GATHER_BODY).
 *
 * Called from Python with raw addresses (ints), through METH_FASTCALL: ~0.07 us a call, where the same
 * six-argument call through ctypes measured ~0.6 us. The caller guarantees that the addresses, lengths
 * and every window are valid: the module is private to niels_gpt (loaded by niels_gpt/_native/
 * __init__.py, called only by cache/pretrain_dataset.py, which computes rows exactly as its numpy path
 * indexes them).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Bumped whenever a signature or behaviour changes, so a stale build left in an editable checkout is
 * refused by __init__.py instead of being called with the wrong arguments. */
#define NATIVE_ABI 3

/* PREFETCH into L2 (locality 2): the lines are used ~8 KiB of source later, twice (x, then y). */
#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 2)
#else
#define PREFETCH(p) ((void)0)
#endif

/* gcc -O3's baseline x86-64 code widens with SSE2 (16-byte stores); an AVX2 clone, picked at load
 * time by the CPU, widens 16 tokens per instruction: the conversion alone (source in cache) goes
 * from ~9.5 to ~6.5 us per 32x1024 batch. AVX-512 measured no faster. Only where the loader can
 * pick (glibc ifunc). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef MULTIVERSION
#define MULTIVERSION
#endif

/* Windows are random, so each one starts with a TLB miss and a cache miss, which cost ~0.5 us each
 * when they come one after another. So, before converting anything, the first line of every window
 * and of every page it crosses is requested (the B page walks overlap); then the batch is converted
 * in blocks of BLOCK_TOKENS, and before each block the source stream (the windows one after the
 * other) is requested up to PREFETCH_BYTES past the block's end, across window boundaries.
 * The kernel alone, on the 400 MB synthetic cache of bench/bench_cache_readers.py, 32x1024 / 8x4096:
 * ~28 / ~19 us with the hardware prefetcher only, ~12 / ~13 prefetching 3 whole windows ahead, ~10 / ~9
 * with this; ~6.5 / ~6.5 when the windows are already in the cache. */
#define PAGE 4096
#define LINE 64
#define PREFETCH_BYTES 8192
#define BLOCK_TOKENS 512

#define GATHER_BODY(T_SRC)                                                                        \
    do {                                                                                          \
        const T_SRC *base = (const T_SRC *)src;                                                   \
        const Py_ssize_t row_bytes = (T + 1) * (Py_ssize_t)sizeof(T_SRC);                         \
        for (Py_ssize_t i = 0; i < B; i++) {                                                      \
            const char *p = (const char *)(base + rows[i]), *end = p + row_bytes;                 \
            PREFETCH(p);                                                                          \
            for (const char *q = (const char *)(((uintptr_t)p | (PAGE - 1)) + 1); q < end; q += PAGE) \
                PREFETCH(q);                                                                      \
        }                                                                                         \
        /* prefetch cursor: byte pf_off of window pf_i, pf_pos bytes into the stream */           \
        Py_ssize_t pf_i = 0, pf_off = 0, pf_pos = 0;                                              \
        for (Py_ssize_t i = 0; i < B; i++) {                                                      \
            const T_SRC *w = base + rows[i];                                                      \
            int64_t *restrict xr = x + i * T;                                                     \
            int64_t *restrict yr = y + i * T;                                                     \
            for (Py_ssize_t j0 = 0; j0 < T; j0 += BLOCK_TOKENS) {                                 \
                Py_ssize_t j1 = j0 + BLOCK_TOKENS < T ? j0 + BLOCK_TOKENS : T;                    \
                Py_ssize_t want = i * row_bytes + j1 * (Py_ssize_t)sizeof(T_SRC) + PREFETCH_BYTES; \
                while (pf_pos < want && pf_i < B) {                                               \
                    PREFETCH((const char *)(base + rows[pf_i]) + pf_off);                         \
                    pf_off += LINE;                                                               \
                    pf_pos += LINE;                                                               \
                    if (pf_off >= row_bytes) {                                                    \
                        pf_i++;                                                                   \
                        pf_off = 0;                                                               \
                        pf_pos = pf_i * row_bytes;                                                \
                    }                                                                             \
                }                                                                                 \
                for (Py_ssize_t j = j0; j < j1; j++) xr[j] = (int64_t)w[j];                       \
                for (Py_ssize_t j = j0; j < j1; j++) yr[j] = (int64_t)w[j + 1];                   \
            }                                                                                     \
        }                                                                                         \
    } while (0)

MULTIVERSION static void gather_xy_u16(const void *src, const int64_t *rows, Py_ssize_t B, Py_ssize_t T,
                                       int64_t *restrict x, int64_t *restrict y) {
    GATHER_BODY(uint16_t);
}

MULTIVERSION static void gather_xy_u32(const void *src, const int64_t *rows, Py_ssize_t B, Py_ssize_t T,
                                       int64_t *restrict x, int64_t *restrict y) {
    GATHER_BODY(uint32_t);
}

static int as_addr(PyObject *o, void **out) {
    *out = PyLong_AsVoidPtr(o);
    return !(*out == NULL && PyErr_Occurred());
}

static int as_ssize(PyObject *o, Py_ssize_t *out) {
    *out = PyLong_AsSsize_t(o);
    return !(*out == -1 && PyErr_Occurred());
}

/* gather_xy(src, itemsize, rows, B, T, out): out is 2*B*T int64; rows is B int64 token offsets. */
static PyObject *gather_xy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *src, *rows, *out;
    Py_ssize_t itemsize, B, T;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "gather_xy(src, itemsize, rows, B, T, out) takes 6 arguments");
        return NULL;
    }
    if (!as_addr(args[0], &src) || !as_ssize(args[1], &itemsize) || !as_addr(args[2], &rows) ||
        !as_ssize(args[3], &B) || !as_ssize(args[4], &T) || !as_addr(args[5], &out))
        return NULL;
    if ((itemsize != 2 && itemsize != 4) || B < 0 || T < 0) {
        PyErr_Format(PyExc_ValueError, "gather_xy: itemsize must be 2 or 4 and B, T >= 0 (got %zd, %zd, %zd)",
                     itemsize, B, T);
        return NULL;
    }
    int64_t *x = (int64_t *)out, *y = x + B * T;
    /* NOTE: the GIL is released only for batches big enough to repay the two calls (~50 ns). */
    if (B * T >= 16384) {
        Py_BEGIN_ALLOW_THREADS
        if (itemsize == 2) gather_xy_u16(src, (const int64_t *)rows, B, T, x, y);
        else gather_xy_u32(src, (const int64_t *)rows, B, T, x, y);
        Py_END_ALLOW_THREADS
    } else {
        if (itemsize == 2) gather_xy_u16(src, (const int64_t *)rows, B, T, x, y);
        else gather_xy_u32(src, (const int64_t *)rows, B, T, x, y);
    }
    Py_RETURN_NONE;
}

/* draws_to_rows(draws, B, cum, K, shift): in place, draw g (a global window-start number) -> the row
 * g + shift[k] of the concatenated mapping, k = the shard with cum[k] <= g < cum[k + 1] (cum has K + 1
 * entries, shift K). Same result as numpy's searchsorted(cum, g, side="right") - 1 on a valid draw. */
static PyObject *draws_to_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *draws, *cum, *shift;
    Py_ssize_t B, K;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "draws_to_rows(draws, B, cum, K, shift) takes 5 arguments");
        return NULL;
    }
    if (!as_addr(args[0], &draws) || !as_ssize(args[1], &B) || !as_addr(args[2], &cum) ||
        !as_ssize(args[3], &K) || !as_addr(args[4], &shift))
        return NULL;
    int64_t *g = (int64_t *)draws;
    const int64_t *c = (const int64_t *)cum, *s = (const int64_t *)shift;
    for (Py_ssize_t i = 0; i < B; i++) {
        Py_ssize_t lo = 0, hi = K;  /* invariant: c[lo] <= g[i] < c[hi] */
        while (hi - lo > 1) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (c[mid] <= g[i]) lo = mid; else hi = mid;
        }
        g[i] += s[lo];
    }
    Py_RETURN_NONE;
}

/* The arguments ids_to_tokens and arrays_to_tokens share: docs a list (of what `docs_are` says), eot an id
 * that fits the token type, itemsize 2 or 4, keep_last; 0 with the exception set, naming `fn`. */
static int tokens_args(const char *fn, const char *docs_are, PyObject *const *args, Py_ssize_t nargs,
                       PyObject **docs, uint32_t *eot, Py_ssize_t *itemsize, Py_ssize_t *keep_last) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s(docs, eot, itemsize, keep_last) takes 4 arguments", fn);
        return 0;
    }
    *docs = args[0];
    if (!PyList_Check(*docs)) {
        PyErr_Format(PyExc_TypeError, "%s: docs must be %s", fn, docs_are);
        return 0;
    }
    unsigned long e = PyLong_AsUnsignedLong(args[1]);
    if ((e == (unsigned long)-1 && PyErr_Occurred()) || !as_ssize(args[2], itemsize) || !as_ssize(args[3], keep_last))
        return 0;
    if (*itemsize != 2 && *itemsize != 4) {
        PyErr_Format(PyExc_ValueError, "%s: itemsize must be 2 or 4, got %zd", fn, *itemsize);
        return 0;
    }
    if (e > (*itemsize == 2 ? 0xFFFFUL : 0xFFFFFFFFUL)) {
        PyErr_Format(PyExc_OverflowError, "%s: eot does not fit the token type", fn);
        return 0;
    }
    *eot = (uint32_t)e;
    return 1;
}

/* ids_to_tokens(docs, eot, itemsize, keep_last) -> bytearray. docs is a list of lists of int ids (what a
 * tokenizer's batch encode returns); the result is every document followed by eot, as native-endian
 * uint16 (itemsize 2) or uint32 (4), the last document keeping only keep_last of its len + 1 tokens,
 * and when cut, ending in eot. An id that does not fit raises OverflowError (the caller then finds the
 * document and reports it). The cache builder's writer thread runs this while holding the GIL, in
 * place of a flat Python list and an int conversion (~3 ns a token against ~13): the shorter that hold,
 * the better two encode threads scale. */
static PyObject *ids_to_tokens(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *docs;
    uint32_t eot;
    Py_ssize_t itemsize, keep_last;
    if (!tokens_args("ids_to_tokens", "a list of lists of int", args, nargs, &docs, &eot, &itemsize, &keep_last))
        return NULL;
    const unsigned long maxv = itemsize == 2 ? 0xFFFFUL : 0xFFFFFFFFUL;
    Py_ssize_t n = PyList_GET_SIZE(docs), total = 0, last_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(docs, i);
        if (!PyList_Check(d)) {
            PyErr_Format(PyExc_TypeError, "ids_to_tokens: document %zd is not a list", i);
            return NULL;
        }
        last_len = PyList_GET_SIZE(d) + 1;
        total += last_len;
    }
    if (n > 0 && (keep_last < 1 || keep_last > last_len)) {
        PyErr_Format(PyExc_ValueError, "ids_to_tokens: keep_last must be in [1, %zd], got %zd", last_len, keep_last);
        return NULL;
    }
    Py_ssize_t out_n = n > 0 ? total - last_len + keep_last : 0;
    PyObject *buf = PyByteArray_FromStringAndSize(NULL, out_n * itemsize);
    if (buf == NULL)
        return NULL;
    char *out = PyByteArray_AS_STRING(buf);
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n && k < out_n; i++) {
        PyObject *d = PyList_GET_ITEM(docs, i);
        Py_ssize_t m = PyList_GET_SIZE(d);
        for (Py_ssize_t j = 0; j <= m && k < out_n; j++, k++) {
            unsigned long v = eot;
            if (j < m) {
                v = PyLong_AsUnsignedLong(PyList_GET_ITEM(d, j));
                if (v == (unsigned long)-1 && PyErr_Occurred()) {
                    if (PyErr_ExceptionMatches(PyExc_OverflowError))
                        PyErr_Format(PyExc_OverflowError, "ids_to_tokens: document %zd has an id out of range", i);
                    Py_DECREF(buf);
                    return NULL;
                }
                if (v > maxv) {
                    PyErr_Format(PyExc_OverflowError, "ids_to_tokens: document %zd has an id out of range", i);
                    Py_DECREF(buf);
                    return NULL;
                }
            }
            if (itemsize == 2) ((uint16_t *)out)[k] = (uint16_t)v;
            else ((uint32_t *)out)[k] = (uint32_t)v;
        }
    }
    if (n > 0 && keep_last < last_len) {  /* a cut document is closed like every other */
        if (itemsize == 2) ((uint16_t *)out)[out_n - 1] = (uint16_t)eot;
        else ((uint32_t *)out)[out_n - 1] = (uint32_t)eot;
    }
    return buf;
}

/* arrays_to_tokens(docs, eot, itemsize, keep_last) -> bytearray: ids_to_tokens for a list of C-contiguous
 * uint32 numpy arrays (the fast encoder's ids), in one pass with the GIL released: each id is range-checked,
 * compared with eot and stored. Raises TypeError for anything but such arrays, OverflowError for an id that
 * does not fit, ValueError for an id equal to eot inside a document (the caller's numpy path then names the
 * document). The writer thread held the GIL through about six numpy passes a batch (concatenate, max, ==,
 * count, cast), each a wait behind the threads that parse and encode. */
static PyObject *arrays_to_tokens(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *docs;
    uint32_t eot;
    Py_ssize_t itemsize, keep_last;
    if (!tokens_args("arrays_to_tokens", "a list of uint32 arrays", args, nargs, &docs, &eot, &itemsize, &keep_last))
        return NULL;
    const uint32_t maxv = itemsize == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    Py_ssize_t n = PyList_GET_SIZE(docs), total = 0, last_len = 0, got = 0;
    Py_buffer *views = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    if (views == NULL)
        return PyErr_NoMemory();
    PyObject *buf = NULL;
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(docs, got), &views[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        const char *f = views[got].format;
        if (views[got].itemsize != 4 || f == NULL || (strcmp(f, "I") != 0 && strcmp(f, "=I") != 0 && strcmp(f, "<I") != 0)) {
            PyBuffer_Release(&views[got]);
            PyErr_Format(PyExc_TypeError, "arrays_to_tokens: document %zd is not a uint32 array", got);
            goto done;
        }
        last_len = views[got].len / 4 + 1;
        total += last_len;
    }
    if (n > 0 && (keep_last < 1 || keep_last > last_len)) {
        PyErr_Format(PyExc_ValueError, "arrays_to_tokens: keep_last must be in [1, %zd], got %zd", last_len, keep_last);
        goto done;
    }
    Py_ssize_t out_n = n > 0 ? total - last_len + keep_last : 0;
    buf = PyByteArray_FromStringAndSize(NULL, out_n * itemsize);
    if (buf == NULL)
        goto done;
    char *out = PyByteArray_AS_STRING(buf);
    int bad = 0;  /* 1: an id out of range, 2: eot inside a document */
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n && k < out_n && !bad; i++) {
        const uint32_t *src = (const uint32_t *)views[i].buf;
        Py_ssize_t m = views[i].len / 4;
        if (m > out_n - k)
            m = out_n - k;  /* the cut document: its ids up to the room, its eot written below */
        uint32_t hi = 0, seen = 0;
        if (itemsize == 2) {
            uint16_t *dst = (uint16_t *)out + k;
            for (Py_ssize_t j = 0; j < m; j++) {
                uint32_t v = src[j];
                hi |= v;
                seen |= (v == eot);
                dst[j] = (uint16_t)v;
            }
        } else {
            uint32_t *dst = (uint32_t *)out + k;
            for (Py_ssize_t j = 0; j < m; j++) {
                uint32_t v = src[j];
                seen |= (v == eot);
                dst[j] = v;
            }
        }
        if (hi > maxv)
            bad = 1;
        else if (seen)
            bad = 2;
        k += m;
        if (k < out_n) {
            if (itemsize == 2) ((uint16_t *)out)[k] = (uint16_t)eot;
            else ((uint32_t *)out)[k] = eot;
            k++;
        }
    }
    if (!bad && n > 0 && keep_last < last_len) {  /* a cut document is closed like every other */
        if (itemsize == 2) ((uint16_t *)out)[out_n - 1] = (uint16_t)eot;
        else ((uint32_t *)out)[out_n - 1] = eot;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(bad == 1 ? PyExc_OverflowError : PyExc_ValueError,
                        bad == 1 ? "arrays_to_tokens: an id out of range" : "arrays_to_tokens: eot inside a document");
        Py_CLEAR(buf);
    }
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    return buf;
}

static PyMethodDef methods[] = {
    {"gather_xy", (PyCFunction)(void (*)(void))gather_xy, METH_FASTCALL,
     "gather_xy(src, itemsize, rows, B, T, out): int64 x and y of B windows of T+1 tokens (addresses)."},
    {"draws_to_rows", (PyCFunction)(void (*)(void))draws_to_rows, METH_FASTCALL,
     "draws_to_rows(draws, B, cum, K, shift): global window-start draws -> rows, in place (addresses)."},
    {"ids_to_tokens", (PyCFunction)(void (*)(void))ids_to_tokens, METH_FASTCALL,
     "ids_to_tokens(docs, eot, itemsize, keep_last): lists of ids -> bytearray of uint16/uint32 with eot after each."},
    {"arrays_to_tokens", (PyCFunction)(void (*)(void))arrays_to_tokens, METH_FASTCALL,
     "arrays_to_tokens(docs, eot, itemsize, keep_last): uint32 arrays -> the same, one pass, GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gather", NULL, -1, methods};

PyMODINIT_FUNC PyInit__gather(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", NATIVE_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
