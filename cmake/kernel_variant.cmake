# A kernel folder for CLFFN_KERNEL_DIR: SOURCES (comma-separated paths) copied into DIR, with
# DEFINES (comma-separated NAME=VALUE) as #define lines at the top of weights.cl, so that a test
# can run the forms of the kernels that no built-in profile chooses.
string(REPLACE "," ";" sources "${SOURCES}")
string(REPLACE "," ";" defines "${DEFINES}")
set(head "")
foreach(d ${defines})
  string(REGEX REPLACE "^([^=]*)=(.*)$" "#define \\1 \\2\n" line "${d}")
  string(APPEND head "${line}")
endforeach()
file(MAKE_DIRECTORY "${DIR}")
foreach(src ${sources})
  get_filename_component(name "${src}" NAME)
  file(READ "${src}" text)
  if(name STREQUAL "weights.cl")
    set(text "${head}${text}")
  endif()
  file(WRITE "${DIR}/${name}" "${text}")
endforeach()
