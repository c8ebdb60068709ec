// A plain CPython module (no torch headers: the compile stays small) over kernel.cu.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern "C" const char *halo_demo_arch_list();
extern "C" int halo_demo_device_status();

static PyObject *arch_list(PyObject *, PyObject *) { return PyUnicode_FromString(halo_demo_arch_list()); }
static PyObject *device_status(PyObject *, PyObject *) { return PyLong_FromLong(halo_demo_device_status()); }

static PyMethodDef methods[] = {
    {"arch_list", arch_list, METH_NOARGS, "the SM versions the kernels were compiled for"},
    {"device_status", device_status, METH_NOARGS, "cudaGetDeviceCount's status code"},
    {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "halo_demo_cuda", nullptr, -1, methods};

PyMODINIT_FUNC PyInit_halo_demo_cuda(void) { return PyModule_Create(&module); }
