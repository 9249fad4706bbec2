# Detects CUDA and NCCL. Sets WAGMA_HAVE_CUDA (ON/OFF) and, when ON, the imported
# target wagma::nccl. NCCL ships no CMake or pkg-config file: look in the toolkit.
set(WAGMA_HAVE_CUDA OFF)
if(NOT WAGMA_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_ROOT} /usr/local/cuda ENV CUDA_HOME PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl
               HINTS ${CUDAToolkit_ROOT} /usr/local/cuda ENV CUDA_HOME PATH_SUFFIXES lib64 lib)
  if(CMAKE_CUDA_COMPILER AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90) # H100; "native" fails on machines without a GPU
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    add_library(wagma_nccl INTERFACE)
    target_include_directories(wagma_nccl INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(wagma_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    add_library(wagma::nccl ALIAS wagma_nccl)
    set(WAGMA_HAVE_CUDA ON)
  elseif(WAGMA_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WAGMA_WITH_CUDA=ON but CUDA (${CMAKE_CUDA_COMPILER}) or NCCL "
                        "(${NCCL_INCLUDE_DIR}, ${NCCL_LIBRARY}) was not found")
  endif()
endif()
