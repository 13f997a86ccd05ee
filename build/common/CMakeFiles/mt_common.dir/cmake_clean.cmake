file(REMOVE_RECURSE
  "CMakeFiles/mt_common.dir/src/err.c.o"
  "CMakeFiles/mt_common.dir/src/err.c.o.d"
  "libmt_common.a"
  "libmt_common.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/mt_common.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
