# lowp_find_onednn(ROOT): the oneDNN that `lowp bench gemm` links as its BF16 peer, into the
# cache variables LOWP_DNNL_INCLUDE_DIR and LOWP_DNNL_LIBRARY (left as they are when set).
# ROOT (a prefix with include/oneapi/dnnl/dnnl.h and lib/libdnnl.so) is taken first, unless its
# dnnl_config.h says the CPU engine runs on SYCL: such a build needs a SYCL CPU device, which
# PyPI's runtimes (intel-sycl-rt, intel-cmplr-lib-ur) do not provide. Then the system paths.
function(lowp_find_onednn root)
  if(LOWP_DNNL_INCLUDE_DIR AND LOWP_DNNL_LIBRARY)
    return()
  endif()
  set(cfg "${root}/include/oneapi/dnnl/dnnl_config.h")
  if(root AND EXISTS "${cfg}" AND EXISTS "${root}/lib/libdnnl.so")
    file(STRINGS "${cfg}" cpu_rt REGEX "^#define DNNL_CPU_RUNTIME ")
    if(cpu_rt MATCHES "SYCL")
      message(STATUS "oneDNN in ${root} runs its CPU engine on SYCL (needs a SYCL CPU device): "
                     "not used as the peer of `lowp bench gemm`")
    else()
      set(LOWP_DNNL_INCLUDE_DIR "${root}/include" CACHE PATH "oneDNN headers" FORCE)
      set(LOWP_DNNL_LIBRARY "${root}/lib/libdnnl.so" CACHE FILEPATH "oneDNN library" FORCE)
      return()
    endif()
  endif()
  find_path(LOWP_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  find_library(LOWP_DNNL_LIBRARY dnnl)
endfunction()
