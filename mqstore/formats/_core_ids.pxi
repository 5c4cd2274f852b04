# The producer's unique ids (formats/msgid.py) and their UNIQ_KEY properties
# (client/batch.py), made for a whole batch in one pass: included by _core.pyx.

from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.string cimport memcpy

cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void *PyUnicode_DATA(object o)

cdef const char *UPPER_HEX = b"0123456789ABCDEF"
cdef enum:
    COUNTER_HEX_CHARS = 4  # the id's last field: a 16-bit counter


def uniq_ids(str head, uint64_t first, Py_ssize_t n):
    """`n` ids: the ASCII `head`, then counters first, first + 1, ... (each & 0xFFFF) as four
    uppercase hex digits: msgid.UniqIdGenerator.next_id's text, n times."""
    cdef Py_ssize_t head_n
    cdef const char *h = PyUnicode_AsUTF8AndSize(head, &head_n)
    if not head.isascii():
        raise ValueError("an id's head is ASCII")
    cdef list out = [None] * n
    cdef Py_ssize_t i
    cdef unsigned int counter
    cdef char *w
    cdef object text
    for i in range(n):
        text = PyUnicode_New(head_n + COUNTER_HEX_CHARS, 127)
        w = <char *>PyUnicode_DATA(text)
        memcpy(w, h, <size_t>head_n)
        counter = <unsigned int>((first + <uint64_t>i) & 0xFFFF)
        w[head_n] = UPPER_HEX[counter >> 12]
        w[head_n + 1] = UPPER_HEX[(counter >> 8) & 0xF]
        w[head_n + 2] = UPPER_HEX[(counter >> 4) & 0xF]
        w[head_n + 3] = UPPER_HEX[counter & 0xF]
        out[i] = text
    return out


def uniq_properties(bytes prefix, list uniq_keys):
    """`prefix + key (UTF-8) + 0x02` for each key: the encoded properties of messages whose
    last property is UNIQ_KEY (prefix ends with its name and 0x01)."""
    cdef Py_ssize_t prefix_n = PyBytes_GET_SIZE(prefix), key_n, i, n = len(uniq_keys)
    cdef const char *p = PyBytes_AS_STRING(prefix)
    cdef const char *key
    cdef list out = [None] * n
    cdef bytes made
    cdef char *w
    for i in range(n):
        key = PyUnicode_AsUTF8AndSize(uniq_keys[i], &key_n)
        made = PyBytes_FromStringAndSize(NULL, prefix_n + key_n + 1)
        w = PyBytes_AS_STRING(made)
        memcpy(w, p, <size_t>prefix_n)
        memcpy(w + prefix_n, key, <size_t>key_n)
        w[prefix_n + key_n] = PROPERTIES_END_BYTE_
        out[i] = made
    return out
