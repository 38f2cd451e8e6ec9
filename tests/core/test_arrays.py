"""tfring.core.arrays: how each kind of array is described to the core and
how results of the caller's kind are made. No job needed."""
import ml_dtypes
import numpy as np
import pytest

from tfring.core import arrays


def test_numpy_buffer_and_codes():
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    a = arrays.adapt(x)
    assert (a.ptr, a.shape, a.code, a.device, a.stream) == (x.ctypes.data, (2, 3), 5, -1, 0)
    out = a.new((4,))
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (4,)


def test_outputs_are_adapted_without_inspecting_them_again():
    x = np.arange(6, dtype=np.float32)
    a = arrays.adapt(x)
    out = a.new_adapted((2, 5))
    assert isinstance(out.array, np.ndarray) and out.array.shape == (2, 5)
    assert out.ptr == out.array.ctypes.data and out.ptr != a.ptr
    assert (out.shape, out.code, out.device, out.stream) == ((2, 5), a.code, -1, 0)


def test_torch_outputs_are_adapted_too():
    torch = pytest.importorskip("torch")
    a = arrays.adapt(torch.zeros(3, dtype=torch.bfloat16))
    out = a.new_adapted((4,))
    assert out.array.dtype == torch.bfloat16 and out.ptr == out.array.data_ptr()


@pytest.mark.parametrize("dtype, code", [
    ("uint8", 0), ("int8", 1), ("uint16", 2), ("int16", 3), ("int32", 4), ("int64", 5),
    ("float16", 6), (ml_dtypes.bfloat16, 7), ("float32", 8), ("float64", 9), ("bool", 10)])
def test_every_core_dtype(dtype, code):
    assert arrays.adapt(np.zeros(2, dtype)).code == code


def test_zero_d_stays_zero_d_and_views_are_made_contiguous():
    assert arrays.adapt(np.float32(3)).shape == ()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = arrays.adapt(base[:, ::2])
    assert a.array.flags.c_contiguous and a.ptr != base.ctypes.data
    np.testing.assert_array_equal(a.array, base[:, ::2])


def test_unsupported_dtypes_and_kinds():
    with pytest.raises(TypeError, match="complex128"):
        arrays.adapt(np.zeros(2, np.complex128))
    with pytest.raises(TypeError, match="cannot use a object"):
        arrays.adapt(object())


class FakeCuda:
    def __init__(self, device=None, stream=None, strides=None, typestr="<f4"):
        if device is not None:
            self.device = device
        self.__cuda_array_interface__ = {"shape": (2, 3), "typestr": typestr,
                                         "data": (0xdead0000, False), "version": 3,
                                         "strides": strides, "stream": stream}


def _device(**attrs):
    return type("Device", (), attrs)()


def test_cuda_array_interface_cupy_and_torch_devices():
    a = arrays.adapt(FakeCuda(_device(id=1), stream=7, typestr="<f2"))
    assert (a.ptr, a.shape, a.dtype, a.code, a.device, a.stream) == (
        0xdead0000, (2, 3), "float16", 6, 1, 7)
    assert arrays.adapt(FakeCuda(_device(index=2), stream=2)).device == 2
    # C-contiguous strides given explicitly are accepted as they are.
    assert arrays.adapt(FakeCuda(_device(id=0), strides=(12, 4))).ptr == 0xdead0000


def test_cuda_array_without_a_device_needs_cupy():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed")
    except ImportError:
        pass
    with pytest.raises(TypeError, match="which GPU"):
        arrays.adapt(FakeCuda())


class HostDLPack:
    """A DLPack-only array of this module's 'package' (results come back
    through this module's from_dlpack)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def from_dlpack(array):
    return HostDLPack(np.asarray(array))


def test_dlpack_host_array_comes_back_as_its_own_kind():
    x = np.arange(4, dtype=np.float32)
    a = arrays.adapt(HostDLPack(x))
    assert a.ptr == x.ctypes.data and a.device == -1 and a.code == 8
    back = a.wrap(a.new((2,)))
    assert isinstance(back, HostDLPack)
