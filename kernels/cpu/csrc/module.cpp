// The Python module the build produces; the ops themselves register in TORCH_LIBRARY
// fragments beside their code and are called as torch.ops.folio_cpu.<name>.
#include <Python.h>

static struct PyModuleDef folio_cpu_module = {PyModuleDef_HEAD_INIT, "_folio_cpu", nullptr,
                                              -1, nullptr};

PyMODINIT_FUNC PyInit__folio_cpu(void) { return PyModule_Create(&folio_cpu_module); }
