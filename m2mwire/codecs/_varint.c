/* LEB128 varint stream -> list of Python ints, validated, in one C pass.
 *
 * The hot step of TokenNative decoding: protobuf's parser reads varints quickly, but handing its
 * container to Python as a list costs more than tiktoken's own decode. Optional: when this module
 * is not built, m2mwire.codecs.varint falls back to protobuf + numpy (same results, same errors).
 *
 * unpack(buffer) -> list[int]; on a bad stream raises ValueError(kind, offset, value) with kind
 * "truncated", "overlong" or "too_big" and the byte offset where the offending varint starts.
 * detokenize(data, start, table, limit) goes from the wire straight to the token bytes: no Python
 * int per token at all, which is what lets TokenNative decoding keep up with tiktoken's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *
bad(const char *kind, Py_ssize_t offset, uint64_t value)
{
    PyObject *args = Py_BuildValue("(snK)", kind, offset, (unsigned long long)value);
    if (args != NULL) {
        PyErr_SetObject(PyExc_ValueError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* Parse n bytes of varints into ids (room for n entries); -1 with an exception set on error. */
static Py_ssize_t
parse_varints(const unsigned char *p, Py_ssize_t n, uint32_t *ids)
{
    Py_ssize_t i = 0, k = 0;
    while (i < n) {
        const Py_ssize_t start = i;
        uint64_t value = 0;
        int shift = 0;
        for (;;) {
            if (i >= n) {
                bad("truncated", start, 0);
                return -1;
            }
            if (i - start >= 5) {
                bad("overlong", start, 0);
                return -1;
            }
            const unsigned char b = p[i++];
            value |= (uint64_t)(b & 0x7F) << shift;
            shift += 7;
            if (!(b & 0x80)) {
                break;
            }
        }
        if (value >= ((uint64_t)1 << 32)) {
            bad("too_big", start, value);
            return -1;
        }
        ids[k++] = (uint32_t)value;
    }
    return k;
}

static PyObject *
unpack(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *list = NULL;
    uint32_t *ids = PyMem_Malloc((view.len ? view.len : 1) * sizeof(uint32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const Py_ssize_t count = parse_varints((const unsigned char *)view.buf, view.len, ids);
    if (count < 0) {
        goto done;
    }
    list = PyList_New(count);
    for (Py_ssize_t k = 0; list != NULL && k < count; k++) {
        PyObject *item = PyLong_FromUnsignedLong(ids[k]);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, k, item);
    }
done:
    PyMem_Free(ids);
    PyBuffer_Release(&view);
    return list;
}

/* RFC 4648 standard alphabet; 255 = not in the alphabet. */
static unsigned char b64_index[256];

static void
init_b64_index(void)
{
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    memset(b64_index, 255, sizeof(b64_index));
    for (int i = 0; i < 64; i++) {
        b64_index[(unsigned char)alphabet[i]] = (unsigned char)i;
    }
}

/* Strict, canonical base64 (padding required, unused bits zero) into out (room for n/4*3).
 * Returns the decoded length, or -1 when the text is not strict base64 (no exception set). */
static Py_ssize_t
b64_strict(const unsigned char *s, Py_ssize_t n, unsigned char *out)
{
    if (n % 4 != 0) {
        return -1;
    }
    int pad = 0;
    if (n > 0 && s[n - 1] == '=') {
        pad = (n > 1 && s[n - 2] == '=') ? 2 : 1;
    }
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n; i += 4) {
        const int last = i + 4 == n;
        const unsigned char a = b64_index[s[i]], b = b64_index[s[i + 1]];
        unsigned char c = b64_index[s[i + 2]], d = b64_index[s[i + 3]];
        if (last && pad >= 1) {
            d = 0;
        }
        if (last && pad == 2) {
            c = 0;
        }
        if ((a | b | c | d) > 63) {
            return -1;
        }
        const uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6) | d;
        out[o++] = (unsigned char)(v >> 16);
        if (last && pad == 2) {
            if (b & 0x0F) {
                return -1; /* non-canonical: unused bits set */
            }
        }
        else if (last && pad == 1) {
            if (c & 0x03) {
                return -1;
            }
            out[o++] = (unsigned char)(v >> 8);
        }
        else {
            out[o++] = (unsigned char)(v >> 8);
            out[o++] = (unsigned char)v;
        }
    }
    return o;
}

/* detokenize(data, start, table, limit) -> bytes | None
 *
 * data[start:] is either the strict base64 text form (str) or the raw varints (bytes-like). Each
 * token id indexes table (a list: bytes, or None for ids outside the vocabulary) and the token
 * bytes are joined, the total checked against limit first. None: the base64 is not strict (the
 * caller explains why). ValueError(kind, position, value): "truncated"/"overlong"/"too_big" (a bad
 * varint at that byte offset), "unknown" (token #position has id value), "limit" (output of
 * position bytes over the limit value). */
static PyObject *
detokenize(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "detokenize(data, start: int, table: list, limit: int)");
        return NULL;
    }
    const Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    const Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if ((start == -1 || limit == -1) && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *table = args[2];
    PyObject *result = NULL;
    Py_buffer view = {0};
    int have_view = 0;
    unsigned char *raw_owned = NULL;
    uint32_t *ids = NULL;
    const unsigned char *raw;
    Py_ssize_t raw_len;

    if (PyUnicode_Check(args[0])) {
        if (!PyUnicode_IS_ASCII(args[0])) {
            Py_RETURN_NONE;
        }
        const Py_ssize_t total = PyUnicode_GET_LENGTH(args[0]);
        if (start < 0 || start > total) {
            Py_RETURN_NONE;
        }
        const Py_ssize_t n = total - start;
        raw_owned = PyMem_Malloc(n / 4 * 3 + 1);
        if (raw_owned == NULL) {
            return PyErr_NoMemory();
        }
        raw_len = b64_strict((const unsigned char *)PyUnicode_DATA(args[0]) + start, n, raw_owned);
        if (raw_len < 0) {
            PyMem_Free(raw_owned);
            Py_RETURN_NONE;
        }
        raw = raw_owned;
    }
    else {
        if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        have_view = 1;
        if (start < 0 || start > view.len) {
            PyErr_SetString(PyExc_IndexError, "start is outside the data");
            goto done;
        }
        raw = (const unsigned char *)view.buf + start;
        raw_len = view.len - start;
    }
    ids = PyMem_Malloc((raw_len ? raw_len : 1) * sizeof(uint32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const Py_ssize_t count = parse_varints(raw, raw_len, ids);
    if (count < 0) {
        goto done;
    }
    const Py_ssize_t vocab = PyList_GET_SIZE(table);
    PyObject **items = PySequence_Fast_ITEMS(table);
    Py_ssize_t size = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *piece = ids[k] < (uint64_t)vocab ? items[ids[k]] : Py_None;
        if (!PyBytes_Check(piece)) {
            bad("unknown", k, ids[k]);
            goto done;
        }
        size += PyBytes_GET_SIZE(piece);
        if (size > limit) {
            bad("limit", size, (uint64_t)limit);
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result != NULL) {
        char *out = PyBytes_AS_STRING(result);
        for (Py_ssize_t k = 0; k < count; k++) {
            PyObject *piece = items[ids[k]];
            const Py_ssize_t len = PyBytes_GET_SIZE(piece);
            memcpy(out, PyBytes_AS_STRING(piece), len);
            out += len;
        }
    }
done:
    PyMem_Free(ids);
    PyMem_Free(raw_owned);
    if (have_view) {
        PyBuffer_Release(&view);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"unpack", unpack, METH_O, "Decode concatenated LEB128 varints into a list of ints."},
    {"detokenize", (PyCFunction)(void (*)(void))detokenize, METH_FASTCALL,
     "Token bytes of the varints (or strict base64 of them) in data[start:], joined; see the source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_varint", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__varint(void)
{
    init_b64_index();
    return PyModule_Create(&module);
}
