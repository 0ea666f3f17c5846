"""The weight stamp's per-call check (core/ptrcheck.py), each edge both ways: torch's function and the
kit's C++ ``PointerCheck``. Every change below must make the check answer "changed", and every
non-change "unchanged": a graph replays fixed addresses, so a missed move reads freed memory, and a
false alarm recaptures every call."""

import gc
import weakref

import pytest
import torch
from torch import nn

from lfm2vl_lab.core import ptrcheck
from lfm2vl_lab.core.guard import WeightStamp


@pytest.fixture(params=[ptrcheck.TORCH, ptrcheck.EXTENSION])
def check_path(request, monkeypatch):
    """Each check the test makes uses this pointer check: torch's, or the C++ one."""
    module = request.getfixturevalue("built_pointer_check")[0] if request.param == ptrcheck.EXTENSION else None
    monkeypatch.setitem(ptrcheck._CHOSEN, "ext", module)
    return request.param


def _check(check_path, tensors, lists=()):
    """The check of ``tensors`` (their pointers now) and ``lists``, made the way a stamp makes it."""
    which, equal = ptrcheck.make_check(list(tensors), [t.data_ptr() for t in tensors],
                                       [(m, m._modules, len(m._modules)) for m in lists])
    assert which == check_path
    assert equal() is True  # unchanged: no false alarm
    return equal


def _tensor():
    return torch.arange(16, dtype=torch.float32)


def test_data_assignment(check_path):
    p = nn.Parameter(_tensor())
    equal = _check(check_path, [_tensor(), p])
    p.data = _tensor()
    assert equal() is False


def test_set_to_another_storage_and_back(check_path):
    t = _tensor()
    own, other = t.untyped_storage(), torch.zeros(16).untyped_storage()
    equal = _check(check_path, [t])
    t.set_(other, 0, (16,))
    assert equal() is False
    t.set_(own, 0, (16,))  # the very storage and offset it had: the same address again
    assert equal() is True


def test_resize_larger_reallocates_and_smaller_keeps_the_address(check_path):
    t = _tensor()
    equal = _check(check_path, [t])
    t.resize_(8)  # fits: the same memory
    assert equal() is True
    t.resize_(4096)  # does not fit: the storage's memory is allocated anew (the old one is still held while copied)
    assert equal() is False


def test_a_tensor_resized_to_nothing_has_no_address(check_path):
    t = _tensor()
    equal = _check(check_path, [t])
    t.resize_(0)  # storage kept, but data_ptr() of a tensor with no elements is null
    assert t.untyped_storage().data_ptr() != 0 and t.data_ptr() == 0
    assert equal() is False


def test_as_strided_with_another_offset(check_path):
    t = _tensor()
    equal = _check(check_path, [t])
    t.as_strided_((4, 2), (2, 1), 0)  # another shape, the same first element: not a move
    assert equal() is True
    t.as_strided_((4, 2), (2, 1), 3)  # the offset is counted in elements: 12 bytes further
    assert equal() is False and t.data_ptr() == t.untyped_storage().data_ptr() + 12


def test_an_empty_tensor_over_a_storage(check_path):
    base = _tensor()
    empty = base[5:5]  # storage and offset, but no elements: data_ptr() is null, not storage + offset
    assert empty.data_ptr() == 0 and empty.storage_offset() == 5
    equal = _check(check_path, [base, empty])
    empty.set_(base.untyped_storage(), 5, (2,))  # now it has elements at that offset
    assert equal() is False


def test_swap_tensors(check_path):
    p = nn.Parameter(_tensor())
    equal = _check(check_path, [p])
    torch.utils.swap_tensors(p, nn.Parameter(_tensor()))  # the same Python object, another TensorImpl
    assert equal() is False


@pytest.mark.parametrize("rekey", [
    lambda ml: ml.insert(0, nn.Linear(2, 2)),  # the same dictionary, one more entry
    lambda ml: ml.__delitem__(0),  # a new dictionary
    lambda ml: ml.pop(1),
    lambda ml: ml.append(nn.Identity()),  # no tensor: only the length says so
])
def test_a_module_list_re_keyed(check_path, rekey):
    ml = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    equal = _check(check_path, list(ml.parameters()), lists=[ml])
    rekey(ml)
    assert equal() is False


def test_a_layer_replaced_in_a_stamped_module_list(check_path):
    ml = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    stamp = WeightStamp({"list": ml})
    assert stamp.pointer_check == check_path and stamp.current()
    ml[1] = nn.Linear(2, 2)  # same dictionary, same length: the registration marks the stamp
    assert not stamp.current()
    assert stamp.changes() == ["list.1.weight was replaced by new storage (cpu float32)",
                               "list.1.bias was replaced by new storage (cpu float32)"]


def test_a_cycle_through_the_check_is_collected(check_path):
    ml = nn.ModuleList([nn.Linear(2, 2)])
    equal = _check(check_path, list(ml.parameters()), lists=[ml])
    ml.check = equal  # the module holds its check, the check holds the module and its tensors
    gone, weight = weakref.ref(ml), weakref.ref(ml[0].weight)
    del ml, equal
    gc.collect()
    assert gone() is None and weight() is None


def test_the_cpp_check_names_bad_lists(built_pointer_check):
    module = built_pointer_check[0]
    with pytest.raises(TypeError, match="PointerCheck: list 0 is a int, not a .module, modules, length. tuple"):
        module.PointerCheck([], [], [3])
    ml = nn.ModuleList()
    check = module.PointerCheck([torch.zeros(1)], [0], [(ml, ml._modules, 0)])
    assert len(check) == 1 and check.equal() is False  # torch.zeros(1) is not at address 0
