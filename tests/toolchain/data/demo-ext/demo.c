/* A compiled function, so the derivation check really runs a compiler. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *greet(PyObject *self, PyObject *args) {
    long n;
    if (!PyArg_ParseTuple(args, "l", &n)) return NULL;
    return PyUnicode_FromFormat("%s %ld", DEMO_GREETING, n * n);
}

static PyMethodDef methods[] = {{"greet", greet, METH_VARARGS, "greeting and n squared"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "halo_demo_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_halo_demo_ext(void) { return PyModule_Create(&module); }
