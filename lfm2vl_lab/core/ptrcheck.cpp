// The weight stamp's pointer check in one tight C++ loop (core/ptrcheck.py builds it on request).
//
// Why: WeightStamp.current() runs before every encode and every text-engine call and compares every
// tensor the graphs read (about 200 for LFM2-VL-450M) with the storage pointer it had at capture.
// torch._C._tensors_data_ptrs_at_indices_equal does that in C++ too, but pybind converts its three
// Python lists element by element on every call, which is most of its cost. This object takes the
// tensors and their pointers once (at capture, and again at rearm) and its equal() takes no
// arguments: per tensor it reads one pointer and compares it, with no conversion.
//
// It keeps the Python tensor objects, not at::Tensor handles, and reads each one's tensor through it
// on every call: torch.utils.swap_tensors gives a Python object another TensorImpl, and a handle to
// the old one would never see that. `param.data = new` changes the TensorImpl's storage in place,
// which either way is seen. Same comparison as torch's function: at::Tensor::data_ptr() (storage
// address plus offset) against the recorded Tensor.data_ptr().
//
// No CUDA code and few headers (not torch/extension.h): it builds with the host compiler alone.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {  // internal linkage: pybind11's own types are hidden, and so is this one

class PointerCheck {
 public:
  PointerCheck(const py::list& tensors, const py::list& pointers) {
    if (tensors.size() != pointers.size()) {
      throw py::value_error("PointerCheck: " + std::to_string(tensors.size()) + " tensors but " +
                            std::to_string(pointers.size()) + " pointers");
    }
    objects_.reserve(tensors.size());
    pointers_.reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      py::object t = tensors[i];
      if (!THPVariable_Check(t.ptr())) {
        throw py::type_error("PointerCheck: item " + std::to_string(i) + " is a " +
                             std::string(Py_TYPE(t.ptr())->tp_name) + ", not a tensor");
      }
      objects_.push_back(std::move(t));
      pointers_.push_back(pointers[i].cast<int64_t>());
    }
  }

  // True when every tensor still has the storage pointer it was given with.
  bool equal() const {
    for (size_t i = 0; i < objects_.size(); ++i) {
      const at::Tensor& t = THPVariable_Unpack(objects_[i].ptr());
      if (reinterpret_cast<int64_t>(t.data_ptr()) != pointers_[i]) {
        return false;
      }
    }
    return true;
  }

  size_t size() const { return objects_.size(); }

 private:
  std::vector<py::object> objects_;  // the Python tensors (owned references)
  std::vector<int64_t> pointers_;    // their data_ptr() when the stamp was taken
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<PointerCheck>(m, "PointerCheck")
      .def(py::init<const py::list&, const py::list&>())
      .def("equal", &PointerCheck::equal)
      .def("__len__", &PointerCheck::size);
}
