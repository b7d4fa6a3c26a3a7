"""Finding libclffn and declaring the C functions the package calls (ctypes).

The library is looked for, in order: the one this package was installed with (the path CMake's
install writes into _install.py), the path in the CLFFN_LIBRARY environment variable, and the
system's search (ctypes.util.find_library). Failing all three, ImportError lists what was tried.
"""
import ctypes
import ctypes.util
import os

_tried = []


def _candidates():
    try:
        from . import _install  # written by `cmake --install` with -DCLFFN_PYTHON=ON
        yield "the library clffn was installed with", _install.LIBRARY
    except ImportError:
        pass
    env = os.environ.get("CLFFN_LIBRARY")
    if env:
        yield "CLFFN_LIBRARY", env
    found = ctypes.util.find_library("clffn")
    if found:
        yield "the system's library path", found


lib_path = None  # where libclffn was loaded from


def _load():
    global lib_path
    for what, path in _candidates():
        try:
            loaded = ctypes.CDLL(path)
            lib_path = path
            return loaded
        except OSError as e:
            _tried.append(f"{what}: {path} ({e})")
    if not _tried:
        _tried.append("no installed library, CLFFN_LIBRARY unset, none on the system's path")
    raise ImportError(
        "clffn: cannot load libclffn. Tried: " + "; ".join(_tried) +
        ". Install clffn (cmake --install build) or set CLFFN_LIBRARY to libclffn.so.")


lib = _load()

c_size = ctypes.c_size_t
c_float_p = ctypes.POINTER(ctypes.c_float)
c_double_p = ctypes.POINTER(ctypes.c_double)


class Config(ctypes.Structure):
    """clffn_config, field for field."""
    _fields_ = [("d_model", c_size), ("d_ff", c_size), ("activation", ctypes.c_int),
                ("gated", ctypes.c_int), ("bias1", ctypes.c_int), ("bias2", ctypes.c_int),
                ("bias_gate", ctypes.c_int), ("dropout", ctypes.c_float),
                ("residual", ctypes.c_int)]


class Weights(ctypes.Structure):
    """clffn_host_weights and clffn_weight_arrays (the same six pointers)."""
    _fields_ = [(n, c_float_p) for n in ("w1", "b1", "v", "bv", "w2", "b2")]


class DeviceInfo(ctypes.Structure):
    """clffn_device_info, field for field."""
    _fields_ = [("platform_index", ctypes.c_uint), ("device_index", ctypes.c_uint),
                ("platform", ctypes.c_void_p), ("device", ctypes.c_void_p),
                ("platform_name", ctypes.c_char * 128), ("name", ctypes.c_char * 128),
                ("vendor", ctypes.c_char * 128), ("driver_version", ctypes.c_char * 128),
                ("device_version", ctypes.c_char * 128),
                ("opencl_c_version", ctypes.c_char * 128), ("type", ctypes.c_uint64),
                ("compute_units", ctypes.c_uint), ("clock_mhz", ctypes.c_uint),
                ("global_mem_bytes", ctypes.c_uint64), ("local_mem_bytes", ctypes.c_uint64),
                ("max_alloc_bytes", ctypes.c_uint64), ("max_work_group_size", c_size),
                ("fp16", ctypes.c_int), ("fp64", ctypes.c_int), ("supported", ctypes.c_int),
                ("denormals", ctypes.c_int), ("software", ctypes.c_int)]


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


vp = ctypes.c_void_p
i32 = ctypes.c_int
u64 = ctypes.c_uint64

status_string = _fn("clffn_status_string", ctypes.c_char_p, i32)
version_string = _fn("clffn_version_string", ctypes.c_char_p)
config_default = _fn("clffn_config_default", Config, c_size, c_size)
config_validate = _fn("clffn_config_validate", i32, ctypes.POINTER(Config))
devices_list = _fn("clffn_devices_list", i32, ctypes.POINTER(DeviceInfo), c_size,
                   ctypes.POINTER(c_size))
devices_default = _fn("clffn_devices_default", i32, ctypes.POINTER(DeviceInfo), c_size,
                      ctypes.POINTER(c_size))


def _check_device_info():
    # clffn_devices_list writes whole structs into the array made here: a library built from
    # another clffn.h would write past it
    size = getattr(lib, "clffn_device_info_size", None)
    theirs = None
    if size is not None:
        size.restype, size.argtypes = c_size, []
        theirs = size()
    if theirs != ctypes.sizeof(DeviceInfo):
        raise OSError(f"{lib_path} is another version of libclffn than this package "
                      f"(clffn_device_info: {theirs or 'unknown'} bytes there, "
                      f"{ctypes.sizeof(DeviceInfo)} here); install both from one build")


_check_device_info()
device_type_name = _fn("clffn_device_type_name", ctypes.c_char_p, ctypes.c_uint64)
context_create_for_device = _fn("clffn_context_create_for_device", i32, ctypes.c_char_p,
                                ctypes.POINTER(vp))
context_destroy = _fn("clffn_context_destroy", None, vp)
context_device_name = _fn("clffn_context_device_name", i32, vp, ctypes.c_char_p, c_size)
context_build_log = _fn("clffn_context_build_log", ctypes.c_char_p, vp)
context_tuning = _fn("clffn_context_tuning", ctypes.c_char_p, vp)
context_set_quantized_inputs = _fn("clffn_context_set_quantized_inputs", i32, vp, ctypes.c_int)
context_quantized_inputs = _fn("clffn_context_quantized_inputs", ctypes.c_int, vp)
context_set_shared_scratch = _fn("clffn_context_set_shared_scratch", i32, vp, ctypes.c_int)
context_shared_scratch = _fn("clffn_context_shared_scratch", ctypes.c_int, vp)
ffn_create = _fn("clffn_ffn_create", i32, vp, ctypes.POINTER(Config), ctypes.POINTER(vp))
ffn_destroy = _fn("clffn_ffn_destroy", None, vp)
ffn_upload_weights = _fn("clffn_ffn_upload_weights", i32, vp, i32, ctypes.POINTER(Weights))
ffn_set_training = _fn("clffn_ffn_set_training", i32, vp, i32)
ffn_set_dropout = _fn("clffn_ffn_set_dropout", i32, vp, ctypes.c_float)
ffn_set_rng = _fn("clffn_ffn_set_rng", i32, vp, u64, u64)
ffn_get_rng = _fn("clffn_ffn_get_rng", i32, vp, ctypes.POINTER(u64), ctypes.POINTER(u64))
forward_host = _fn("clffn_forward_host", i32, vp, c_size, c_float_p, c_size, c_float_p, c_size)
backward_host = _fn("clffn_backward_host", i32, vp, c_size, c_float_p, c_size, c_float_p, c_size,
                    c_float_p, c_size, ctypes.POINTER(Weights), i32)
read_hidden = _fn("clffn_ffn_read_hidden", i32, vp, i32, c_float_p, c_size,
                  ctypes.POINTER(c_size))
# weights kept in their stored type
class TypedWeights(ctypes.Structure):
    """clffn_typed_weights, field for field."""
    _fields_ = [("dtype", ctypes.c_int), ("w1", vp), ("v", vp), ("w2", vp), ("b1", c_float_p),
                ("bv", c_float_p), ("b2", c_float_p)]


DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")  # clffn_dtype's values, in order
ffn_upload_weights_typed = _fn("clffn_ffn_upload_weights_typed", i32, vp, i32,
                               ctypes.POINTER(TypedWeights))
ffn_weight_dtype = _fn("clffn_ffn_weight_dtype", i32, vp)
ffn_weight_bytes = _fn("clffn_ffn_weight_bytes", c_size, vp)
ffn_error_message = _fn("clffn_ffn_error_message", ctypes.c_char_p, vp)
dtype_bytes = _fn("clffn_dtype_bytes", i32, i32, c_size, ctypes.POINTER(c_size))
convert_weights = _fn("clffn_convert_weights", i32, i32, c_float_p, c_size, vp, c_size)
convert_to_f32 = _fn("clffn_convert_to_f32", i32, i32, vp, c_size, c_size, c_float_p, c_size)
# hooks: the library's own dropout mask and double reference, for checks against the C side
dropout_keep = _fn("clffn_dropout_keep", i32, ctypes.c_float, u64, u64, u64)
tuning_has_profile = _fn("clffn_tuning_has_profile", i32, vp)


# -- the checkpoint loader (libclffn_io): clffn-run's safetensors reader, loaded on first use ---
class StTensor(ctypes.Structure):
    """clffn_st_tensor (src/io/clffn_io.h), field for field."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", c_size),
                ("shape", ctypes.c_uint64 * 16), ("numel", ctypes.c_uint64),
                ("begin", ctypes.c_uint64), ("end", ctypes.c_uint64)]


class StFile(ctypes.Structure):
    """clffn_st_file, field for field."""
    _fields_ = [("data", ctypes.c_void_p), ("data_len", ctypes.c_uint64),
                ("tensors", ctypes.POINTER(StTensor)), ("count", c_size),
                ("map", ctypes.c_void_p), ("map_len", c_size)]


class GgufTensor(ctypes.Structure):
    """clffn_gguf_tensor, field for field."""
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_uint32), ("rank", c_size),
                ("ne", ctypes.c_uint64 * 4), ("numel", ctypes.c_uint64),
                ("offset", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class GgufFile(ctypes.Structure):
    """clffn_gguf_file, field for field."""
    _fields_ = [("version", ctypes.c_uint32), ("alignment", ctypes.c_uint64),
                ("kvs", ctypes.c_void_p), ("kv_count", c_size),
                ("tensors", ctypes.POINTER(GgufTensor)), ("count", c_size),
                ("data", ctypes.c_void_p), ("data_len", ctypes.c_uint64),
                ("map", ctypes.c_void_p), ("map_len", c_size)]


IO_ERR = 256
_io = None


def io():
    """libclffn_io with its functions declared: the one installed with this package, else
    CLFFN_IO_LIBRARY, else the one beside libclffn, else the system's. ImportError if none."""
    global _io
    if _io is not None:
        return _io
    paths, tried = [], []
    try:
        from . import _install
        paths.append(getattr(_install, "IO_LIBRARY", None))
    except ImportError:
        pass
    paths.append(os.environ.get("CLFFN_IO_LIBRARY"))
    if lib_path and os.sep in lib_path:
        d = os.path.dirname(lib_path)
        paths += [os.path.join(d, "libclffn_io.so"), os.path.join(d, "libclffn_io.so.0")]
    paths.append(ctypes.util.find_library("clffn_io"))
    for p in paths:
        if not p:
            continue
        try:
            lib_io = ctypes.CDLL(p)
            break
        except OSError as e:
            tried.append(f"{p} ({e})")
    else:
        raise ImportError("clffn: cannot load libclffn_io (the checkpoint loader, built with "
                          "-DCLFFN_PYTHON=ON). Tried: " + ("; ".join(tried) or "nothing found") +
                          ". Set CLFFN_IO_LIBRARY to libclffn_io.so.")
    err = ctypes.c_char_p
    for name, res, args in (
            ("clffn_st_open", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(StFile), err]),
            ("clffn_st_read_f32", ctypes.c_int,
             [ctypes.POINTER(StFile), ctypes.POINTER(StTensor), c_float_p, err]),
            ("clffn_st_close", None, [ctypes.POINTER(StFile)]),
            ("clffn_io_dtype_name", ctypes.c_char_p, [ctypes.c_int]),
            ("clffn_io_dtype_is_convertible", ctypes.c_int, [ctypes.c_int]),
            ("clffn_gguf_open", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(GgufFile), err]),
            ("clffn_gguf_close", None, [ctypes.POINTER(GgufFile)]),
            ("clffn_gguf_type_name", ctypes.c_char_p, [ctypes.c_uint32]),
            ("clffn_gguf_string", ctypes.c_int,
             [ctypes.POINTER(GgufFile), ctypes.c_char_p, ctypes.c_char_p, c_size])):
        f = getattr(lib_io, name)
        f.restype, f.argtypes = res, args
    _io = lib_io
    return _io


class MoeConfig(ctypes.Structure):
    """clffn_moe_config, field for field."""
    _fields_ = [("expert", Config), ("experts", c_size), ("top_k", c_size),
                ("routing", ctypes.c_int), ("router_bias", ctypes.c_int),
                ("shared_expert", ctypes.c_int), ("aux_loss_coef", ctypes.c_float),
                ("shared_d_ff", c_size), ("shared_gate", ctypes.c_int)]


moe_config_default = _fn("clffn_moe_config_default", MoeConfig, c_size, c_size, c_size, c_size)
moe_create = _fn("clffn_moe_create", ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(MoeConfig),
                 ctypes.POINTER(ctypes.c_void_p))
moe_destroy = _fn("clffn_moe_destroy", None, ctypes.c_void_p)
moe_set_counts = _fn("clffn_moe_set_counts", ctypes.c_int32, ctypes.c_void_p, ctypes.c_int)
moe_set_grouping = _fn("clffn_moe_set_grouping", ctypes.c_int32, ctypes.c_void_p, ctypes.c_int)
moe_experts_grouped = _fn("clffn_moe_experts_grouped", ctypes.c_int, ctypes.c_void_p)
moe_counts_kept = _fn("clffn_moe_counts_kept", ctypes.c_int, ctypes.c_void_p)
moe_expert = _fn("clffn_moe_expert", ctypes.c_void_p, ctypes.c_void_p, c_size)
moe_upload_router = _fn("clffn_moe_upload_router", ctypes.c_int32, ctypes.c_void_p, c_float_p,
                        c_float_p)
moe_forward_host = _fn("clffn_moe_forward_host", ctypes.c_int32, ctypes.c_void_p, c_size,
                       c_float_p, c_size, c_float_p, c_size, ctypes.POINTER(ctypes.c_int32),
                       c_float_p)
moe_backward_host = _fn("clffn_moe_backward_host", ctypes.c_int32, ctypes.c_void_p, c_size,
                        c_float_p, c_size, c_float_p, c_size, c_float_p, c_float_p,
                        ctypes.POINTER(Weights), ctypes.c_int)
moe_aux_loss = _fn("clffn_moe_aux_loss", ctypes.c_int32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_double))
