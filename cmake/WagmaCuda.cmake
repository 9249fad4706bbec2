# Detects CUDA and NCCL (WAGMA_WITH_CUDA: AUTO = use them when found, ON = required, OFF = never).
#   WAGMA_HAVE_CUDA  ON when nvcc, the CUDA runtime and cuBLAS are found: CUDA is enabled as a
#                    language and the CUDA sources (agent/train's backend) are compiled.
#   WAGMA_HAVE_NCCL  ON when NCCL is found as well; then the imported target wagma::nccl.
# nvcc is looked for on PATH / CUDACXX and then in /usr/local/cuda, where every machine here
# (CI included) has it, so AUTO needs no extra flags. No GPU is needed to build: the code is
# compiled for sm_80 and sm_90 plus sm_90 PTX (CMAKE_CUDA_ARCHITECTURES "80;90"; "native" would
# fail on a machine without a GPU). Override with -DCMAKE_CUDA_ARCHITECTURES=...
set(WAGMA_HAVE_CUDA OFF)
set(WAGMA_HAVE_NCCL OFF)
if(NOT WAGMA_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # One CUDA runtime for every target, the shared one (cuBLAS and NCCL are shared libraries
    # too): executables that link a library with CUDA code must not add cudart_static.
    if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # "80" = sm_80 code + compute_80 PTX, "90" = sm_90 code + compute_90 PTX (JIT for newer GPUs)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cudart AND TARGET CUDA::cublas)
      set(WAGMA_HAVE_CUDA ON)
    endif()
  endif()
  if(WAGMA_HAVE_CUDA)
    find_path(NCCL_INCLUDE_DIR nccl.h
              HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT} /usr/local/cuda ENV CUDA_HOME
              PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY nccl
                 HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT} /usr/local/cuda ENV CUDA_HOME
                 PATH_SUFFIXES lib64 lib)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      add_library(wagma_nccl INTERFACE)
      target_include_directories(wagma_nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(wagma_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
      add_library(wagma::nccl ALIAS wagma_nccl)
      set(WAGMA_HAVE_NCCL ON)
    endif()
  endif()
  if(WAGMA_WITH_CUDA STREQUAL "ON" AND NOT (WAGMA_HAVE_CUDA AND WAGMA_HAVE_NCCL))
    message(FATAL_ERROR "WAGMA_WITH_CUDA=ON but CUDA (nvcc '${CMAKE_CUDA_COMPILER}', cuBLAS) or "
                        "NCCL (${NCCL_INCLUDE_DIR}, ${NCCL_LIBRARY}) was not found")
  endif()
endif()
