/* Status names and the library version. */
#include "clffn.h"

unsigned clffn_version_number(void) { return CLFFN_VERSION_NUMBER; }

const char *clffn_version_string(void) { return CLFFN_VERSION_STRING; }

const char *clffn_status_string(int status) {
    switch (status) {
    case CLFFN_SUCCESS: return "CLFFN_SUCCESS";
    /* clffn's own */
    case CLFFN_ERROR_NULL_ARGUMENT: return "CLFFN_ERROR_NULL_ARGUMENT: a required pointer or handle is NULL";
    case CLFFN_ERROR_INVALID_SIZE: return "CLFFN_ERROR_INVALID_SIZE: a dimension is zero";
    case CLFFN_ERROR_SIZE_OVERFLOW: return "CLFFN_ERROR_SIZE_OVERFLOW: size overflows size_t or the device's max allocation";
    case CLFFN_ERROR_BUFFER_TOO_SMALL: return "CLFFN_ERROR_BUFFER_TOO_SMALL: a buffer is smaller than the shape needs";
    case CLFFN_ERROR_INVALID_DROPOUT: return "CLFFN_ERROR_INVALID_DROPOUT: dropout p must be in [0, 1]";
    case CLFFN_ERROR_INVALID_ACTIVATION: return "CLFFN_ERROR_INVALID_ACTIVATION: unknown activation";
    case CLFFN_ERROR_INVALID_LAYOUT: return "CLFFN_ERROR_INVALID_LAYOUT: unknown weight layout";
    case CLFFN_ERROR_INVALID_ARGUMENT: return "CLFFN_ERROR_INVALID_ARGUMENT: an argument is out of range";
    case CLFFN_ERROR_DEVICE_NOT_FOUND: return "CLFFN_ERROR_DEVICE_NOT_FOUND: no OpenCL device matches";
    case CLFFN_ERROR_DEVICE_UNSUPPORTED: return "CLFFN_ERROR_DEVICE_UNSUPPORTED: device lacks OpenCL 1.2 or a compiler";
    case CLFFN_ERROR_NO_WEIGHTS: return "CLFFN_ERROR_NO_WEIGHTS: no weights uploaded or bound";
    case CLFFN_ERROR_INVALID_QUEUE: return "CLFFN_ERROR_INVALID_QUEUE: queue is out-of-order or of another context/device";
    case CLFFN_ERROR_KERNEL_SOURCE: return "CLFFN_ERROR_KERNEL_SOURCE: a kernel file under CLFFN_KERNEL_DIR cannot be read";
    case CLFFN_ERROR_NO_FORWARD: return "CLFFN_ERROR_NO_FORWARD: no forward has run yet";
    case CLFFN_ERROR_BUFFER_OVERLAP: return "CLFFN_ERROR_BUFFER_OVERLAP: output partly overlaps input";
    case CLFFN_ERROR_OUT_OF_HOST_MEMORY: return "CLFFN_ERROR_OUT_OF_HOST_MEMORY: host allocation failed";
    /* OpenCL's, passed through */
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -2: return "CL_DEVICE_NOT_AVAILABLE";
    case -3: return "CL_COMPILER_NOT_AVAILABLE";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -7: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -8: return "CL_MEM_COPY_OVERLAP";
    case -9: return "CL_IMAGE_FORMAT_MISMATCH";
    case -10: return "CL_IMAGE_FORMAT_NOT_SUPPORTED";
    case -11: return "CL_BUILD_PROGRAM_FAILURE (see clffn_context_build_log)";
    case -12: return "CL_MAP_FAILURE";
    case -13: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
    case -14: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -15: return "CL_COMPILE_PROGRAM_FAILURE";
    case -16: return "CL_LINKER_NOT_AVAILABLE";
    case -17: return "CL_LINK_PROGRAM_FAILURE";
    case -18: return "CL_DEVICE_PARTITION_FAILED";
    case -19: return "CL_KERNEL_ARG_INFO_NOT_AVAILABLE";
    case -30: return "CL_INVALID_VALUE";
    case -31: return "CL_INVALID_DEVICE_TYPE";
    case -32: return "CL_INVALID_PLATFORM";
    case -33: return "CL_INVALID_DEVICE";
    case -34: return "CL_INVALID_CONTEXT";
    case -35: return "CL_INVALID_QUEUE_PROPERTIES";
    case -36: return "CL_INVALID_COMMAND_QUEUE";
    case -37: return "CL_INVALID_HOST_PTR";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -39: return "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR";
    case -40: return "CL_INVALID_IMAGE_SIZE";
    case -41: return "CL_INVALID_SAMPLER";
    case -42: return "CL_INVALID_BINARY";
    case -43: return "CL_INVALID_BUILD_OPTIONS";
    case -44: return "CL_INVALID_PROGRAM";
    case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46: return "CL_INVALID_KERNEL_NAME";
    case -47: return "CL_INVALID_KERNEL_DEFINITION";
    case -48: return "CL_INVALID_KERNEL";
    case -49: return "CL_INVALID_ARG_INDEX";
    case -50: return "CL_INVALID_ARG_VALUE";
    case -51: return "CL_INVALID_ARG_SIZE";
    case -52: return "CL_INVALID_KERNEL_ARGS";
    case -53: return "CL_INVALID_WORK_DIMENSION";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -55: return "CL_INVALID_WORK_ITEM_SIZE";
    case -56: return "CL_INVALID_GLOBAL_OFFSET";
    case -57: return "CL_INVALID_EVENT_WAIT_LIST";
    case -58: return "CL_INVALID_EVENT";
    case -59: return "CL_INVALID_OPERATION";
    case -60: return "CL_INVALID_GL_OBJECT";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -62: return "CL_INVALID_MIP_LEVEL";
    case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -64: return "CL_INVALID_PROPERTY";
    case -65: return "CL_INVALID_IMAGE_DESCRIPTOR";
    case -66: return "CL_INVALID_COMPILER_OPTIONS";
    case -67: return "CL_INVALID_LINKER_OPTIONS";
    case -68: return "CL_INVALID_DEVICE_PARTITION_COUNT";
    case CLFFN_PLATFORM_NOT_FOUND: return "CL_PLATFORM_NOT_FOUND_KHR: no OpenCL platform is installed (e.g. apt-get install pocl-opencl-icd)";
    /* CLBlast's, passed through */
    case -1024: return "CLBlastNotImplemented";
    case -1022: return "CLBlastInvalidMatrixA";
    case -1021: return "CLBlastInvalidMatrixB";
    case -1020: return "CLBlastInvalidMatrixC";
    case -1017: return "CLBlastInvalidDimension";
    case -1016: return "CLBlastInvalidLeadDimA";
    case -1015: return "CLBlastInvalidLeadDimB";
    case -1014: return "CLBlastInvalidLeadDimC";
    case -1011: return "CLBlastInsufficientMemoryA";
    case -1010: return "CLBlastInsufficientMemoryB";
    case -1009: return "CLBlastInsufficientMemoryC";
    case -2050: return "CLBlastInsufficientMemoryTemp";
    case -2048: return "CLBlastInvalidOverrideKernel";
    case -2047: return "CLBlastMissingOverrideParameter";
    case -2046: return "CLBlastInvalidLocalMemUsage";
    case -2045: return "CLBlastNoHalfPrecision";
    case -2044: return "CLBlastNoDoublePrecision";
    case -2043: return "CLBlastInvalidVectorScalar";
    case -2042: return "CLBlastInsufficientMemoryScalar";
    case -2041: return "CLBlastDatabaseError";
    case -2040: return "CLBlastUnknownError";
    case -2039: return "CLBlastUnexpectedError";
    default: return "unknown status";
    }
}
