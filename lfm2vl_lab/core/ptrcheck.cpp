// The weight stamp's per-call check in one tight C++ loop (core/ptrcheck.py builds it on request).
//
// Why: WeightStamp.current() runs before every encode and every text-engine call and compares every
// tensor the graphs read (about 200 for LFM2-VL-450M) with the storage pointer it had at capture.
// torch._C._tensors_data_ptrs_at_indices_equal does that in C++ too, but pybind converts its three
// Python lists element by element on every call, which is most of its cost. This object takes the
// tensors and their pointers once (at capture, and again at rearm) and its equal() takes no
// arguments: per tensor it reads one pointer and compares it, with no conversion.
//
// Why a plain CPython type and no pybind11: equal() is the whole hot path, and pybind11's call
// dispatch (argument loaders, overload chain, result cast) is a fixed cost on every call on top of the
// loop. Here it is a METH_NOARGS method: CPython calls the C function directly (about 20 ns).
//
// It keeps the Python tensor objects, not at::Tensor handles, and reads each one's TensorImpl through
// it on every call: torch.utils.swap_tensors gives a Python object another TensorImpl, and a handle
// to the old one would never see that. `param.data = new`, `.set_()`, `resize_` and `as_strided_`
// change the TensorImpl's storage or offset in place, which is read afresh too. The address is the
// one at::Tensor::data_ptr() gives (storage address plus offset times item size, null for a tensor
// with no elements), read from the TensorImpl's fields rather than through data_ptr(), which first
// asks the virtual has_storage(); a tensor with no storage or no dtype goes through data_ptr()
// itself (which raises as torch's function would). The storage is read as const: unlike data_ptr(),
// that never materializes a copy-on-write storage, which would move the very tensor being checked.
//
// It also holds each ModuleList of the parts with the dictionary and length it had (the Python
// check `m._modules is not modules or len(modules) != n`): insert, del and pop re-key a list with no
// registration hook, and this is the per-call place that sees it.
//
// It takes part in garbage collection: a cycle through it (a module that holds its stamp's check)
// is collected.
//
// No CUDA code and few headers (not torch/extension.h): it builds with the host compiler alone.
#include <Python.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <exception>

namespace {  // internal linkage: nothing here clashes with another extension's names

struct Watched {  // one tensor: the Python object (owned) and its pointer when the stamp was taken
  PyObject* tensor;
  uintptr_t pointer;
};

struct Listed {  // one ModuleList: the module, its _modules dictionary then (both owned), its length then
  PyObject* module;
  PyObject* modules;
  Py_ssize_t length;
};

struct PointerCheck {
  PyObject_HEAD
  Watched* tensors;
  Py_ssize_t n_tensors;
  Listed* lists;
  Py_ssize_t n_lists;
  bool cleared;  // the collector took its references (a cycle): it can vouch for nothing any more
};

PyObject* modules_name = nullptr;  // the interned "_modules"

// Where a TensorImpl keeps its element count (a protected field, next to the offset and dtype the
// address needs): its address is prefetched, never read through this.
struct ImplFields : c10::TensorImpl {
  static constexpr int64_t c10::TensorImpl::*numel = &ImplFields::numel_;
};

// How far ahead the loop prefetches: each tensor's address is three dependent loads (Python object,
// TensorImpl, StorageImpl) over four cache lines, so the loop waits on memory, not on arithmetic.
// Fetching the objects 12 tensors ahead and the TensorImpls' two lines 6 ahead overlaps those waits
// (about a fifth off the 450M's 203 tensors on a 2-core EPYC, and more when they are not in cache).
constexpr Py_ssize_t kObjectsAhead = 12, kImplsAhead = 6;

// The tensor's data address as at::Tensor::data_ptr() computes it (TensorImpl::data_impl).
inline uintptr_t address(PyObject* obj) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();
  if (C10_UNLIKELY(!storage || !impl->dtype_initialized())) {
    return reinterpret_cast<uintptr_t>(t.data_ptr());
  }
  if (impl->numel() == 0) {  // what data_ptr() gives a tensor with no elements, whatever its storage
    return 0;
  }
  const char* data = static_cast<const char*>(storage.data());
  return reinterpret_cast<uintptr_t>(data + impl->dtype().itemsize() * impl->storage_offset());
}

void release(PointerCheck* self) {
  Watched* tensors = self->tensors;
  Py_ssize_t n_tensors = self->n_tensors;
  Listed* lists = self->lists;
  Py_ssize_t n_lists = self->n_lists;
  self->tensors = nullptr, self->n_tensors = 0, self->lists = nullptr, self->n_lists = 0;
  for (Py_ssize_t i = 0; i < n_tensors; ++i) {
    Py_DECREF(tensors[i].tensor);
  }
  for (Py_ssize_t i = 0; i < n_lists; ++i) {
    Py_DECREF(lists[i].module);
    Py_DECREF(lists[i].modules);
  }
  PyMem_Free(tensors);
  PyMem_Free(lists);
}

int take_tensors(PointerCheck* self, PyObject* tensors, PyObject* pointers) {
  PyObject* ts = PySequence_Fast(tensors, "PointerCheck: tensors must be a sequence");
  if (ts == nullptr) {
    return -1;
  }
  PyObject* ps = PySequence_Fast(pointers, "PointerCheck: pointers must be a sequence");
  if (ps == nullptr) {
    Py_DECREF(ts);
    return -1;
  }
  int rc = -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(ts);
  if (n != PySequence_Fast_GET_SIZE(ps)) {
    PyErr_Format(PyExc_ValueError, "PointerCheck: %zd tensors but %zd pointers", n, PySequence_Fast_GET_SIZE(ps));
  } else if ((self->tensors = PyMem_New(Watched, n > 0 ? n : 1)) == nullptr) {
    PyErr_NoMemory();
  } else {
    rc = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* t = PySequence_Fast_GET_ITEM(ts, i);
      if (!THPVariable_Check(t)) {
        PyErr_Format(PyExc_TypeError, "PointerCheck: item %zd is a %s, not a tensor", i, Py_TYPE(t)->tp_name);
        rc = -1;
        break;
      }
      void* p = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(ps, i));
      if (p == nullptr && PyErr_Occurred()) {
        rc = -1;
        break;
      }
      Py_INCREF(t);
      self->tensors[self->n_tensors++] = {t, reinterpret_cast<uintptr_t>(p)};
    }
  }
  Py_DECREF(ts);
  Py_DECREF(ps);
  return rc;
}

int take_lists(PointerCheck* self, PyObject* lists) {
  PyObject* ls = PySequence_Fast(lists, "PointerCheck: lists must be a sequence of (module, modules, length)");
  if (ls == nullptr) {
    return -1;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(ls);
  int rc = 0;
  if ((self->lists = PyMem_New(Listed, n > 0 ? n : 1)) == nullptr) {
    PyErr_NoMemory();
    rc = -1;
  }
  for (Py_ssize_t i = 0; rc == 0 && i < n; ++i) {
    PyObject *module, *modules;
    Py_ssize_t length;
    PyObject* item = PySequence_Fast_GET_ITEM(ls, i);
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OOn", &module, &modules, &length)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "PointerCheck: list %zd is a %s, not a (module, modules, length) tuple", i,
                   Py_TYPE(item)->tp_name);
      rc = -1;
      break;
    }
    Py_INCREF(module);
    Py_INCREF(modules);
    self->lists[self->n_lists++] = {module, modules, length};
  }
  Py_DECREF(ls);
  return rc;
}

int PointerCheck_init(PyObject* op, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<PointerCheck*>(op);
  static const char* kwlist[] = {"tensors", "pointers", "lists", nullptr};
  PyObject *tensors, *pointers, *lists = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:PointerCheck", const_cast<char**>(kwlist), &tensors,
                                   &pointers, &lists)) {
    return -1;
  }
  release(self);  // __init__ called again: start afresh
  self->cleared = false;
  if (take_tensors(self, tensors, pointers) < 0 || (lists != nullptr && take_lists(self, lists) < 0)) {
    release(self);
    return -1;
  }
  return 0;
}

// True while every ModuleList keeps its dictionary and length and every tensor its pointer.
PyObject* PointerCheck_equal(PyObject* op, PyObject* /*unused*/) {
  auto* self = reinterpret_cast<PointerCheck*>(op);
  if (C10_UNLIKELY(self->cleared)) {  // a finalizer in the collected cycle may still call it
    Py_RETURN_FALSE;
  }
  for (Py_ssize_t i = 0; i < self->n_lists; ++i) {
    const Listed& l = self->lists[i];
    PyObject* now = PyObject_GetAttr(l.module, modules_name);  // m._modules, as the attribute reads now
    if (now == nullptr) {
      return nullptr;
    }
    Py_DECREF(now);  // only its identity is compared, and l.modules keeps that object alive
    if (now != l.modules) {
      Py_RETURN_FALSE;
    }
    Py_ssize_t length = PyObject_Size(l.modules);
    if (length < 0) {
      return nullptr;
    }
    if (length != l.length) {
      Py_RETURN_FALSE;
    }
  }
  try {
    const Watched* w = self->tensors;
    const Py_ssize_t n = self->n_tensors;
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (i + kObjectsAhead < n) {
        __builtin_prefetch(&reinterpret_cast<THPVariable*>(w[i + kObjectsAhead].tensor)->cdata);
      }
      if (i + kImplsAhead < n) {
        const c10::TensorImpl* ahead = THPVariable_Unpack(w[i + kImplsAhead].tensor).unsafeGetTensorImpl();
        __builtin_prefetch(&ahead->unsafe_storage());
        __builtin_prefetch(&(ahead->*ImplFields::numel));
      }
      if (address(w[i].tensor) != w[i].pointer) {
        Py_RETURN_FALSE;
      }
    }
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_TRUE;
}

Py_ssize_t PointerCheck_len(PyObject* op) {
  return reinterpret_cast<PointerCheck*>(op)->n_tensors;
}

int PointerCheck_traverse(PyObject* op, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<PointerCheck*>(op);
  for (Py_ssize_t i = 0; i < self->n_tensors; ++i) {
    Py_VISIT(self->tensors[i].tensor);
  }
  for (Py_ssize_t i = 0; i < self->n_lists; ++i) {
    Py_VISIT(self->lists[i].module);
    Py_VISIT(self->lists[i].modules);
  }
  return 0;
}

int PointerCheck_clear(PyObject* op) {
  release(reinterpret_cast<PointerCheck*>(op));
  reinterpret_cast<PointerCheck*>(op)->cleared = true;
  return 0;
}

void PointerCheck_dealloc(PyObject* op) {
  PyObject_GC_UnTrack(op);
  release(reinterpret_cast<PointerCheck*>(op));
  Py_TYPE(op)->tp_free(op);
}

PyMethodDef PointerCheck_methods[] = {
    {"equal", PointerCheck_equal, METH_NOARGS,
     "True while every ModuleList keeps its dictionary and length and every tensor its data pointer."},
    {nullptr, nullptr, 0, nullptr},
};

PySequenceMethods PointerCheck_as_sequence = {PointerCheck_len};

PyTypeObject PointerCheckType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT};

}  // namespace

#define PTRCHECK_CONCAT_(a, b) a##b
#define PTRCHECK_CONCAT(a, b) PTRCHECK_CONCAT_(a, b)
#define PTRCHECK_STR_(a) #a
#define PTRCHECK_STR(a) PTRCHECK_STR_(a)

// The name torch.utils.cpp_extension.load gives the build (TORCH_EXTENSION_NAME) is the module's name.
PyMODINIT_FUNC PTRCHECK_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PointerCheckType.tp_name = PTRCHECK_STR(TORCH_EXTENSION_NAME) ".PointerCheck";
  PointerCheckType.tp_doc =
      "PointerCheck(tensors, pointers, lists=()): equal() is True while each tensor has its pointer and each "
      "(module, modules, length) of lists still has module._modules is modules and len(modules) == length.";
  PointerCheckType.tp_basicsize = sizeof(PointerCheck);
  PointerCheckType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  PointerCheckType.tp_new = PyType_GenericNew;
  PointerCheckType.tp_init = PointerCheck_init;
  PointerCheckType.tp_dealloc = PointerCheck_dealloc;
  PointerCheckType.tp_traverse = PointerCheck_traverse;
  PointerCheckType.tp_clear = PointerCheck_clear;
  PointerCheckType.tp_methods = PointerCheck_methods;
  PointerCheckType.tp_as_sequence = &PointerCheck_as_sequence;
  if (PyType_Ready(&PointerCheckType) < 0) {
    return nullptr;
  }
  if (modules_name == nullptr && (modules_name = PyUnicode_InternFromString("_modules")) == nullptr) {
    return nullptr;
  }
  module_def.m_name = PTRCHECK_STR(TORCH_EXTENSION_NAME);
  module_def.m_doc = "The weight stamp's pointer check (lfm2vl_lab/core/ptrcheck.cpp).";
  module_def.m_size = -1;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) {
    return nullptr;
  }
  Py_INCREF(&PointerCheckType);
  if (PyModule_AddObject(m, "PointerCheck", reinterpret_cast<PyObject*>(&PointerCheckType)) < 0) {
    Py_DECREF(&PointerCheckType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
