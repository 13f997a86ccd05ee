file(REMOVE_RECURSE
  "CMakeFiles/mt_embedding.dir/src/changes.c.o"
  "CMakeFiles/mt_embedding.dir/src/changes.c.o.d"
  "CMakeFiles/mt_embedding.dir/src/optim.c.o"
  "CMakeFiles/mt_embedding.dir/src/optim.c.o.d"
  "CMakeFiles/mt_embedding.dir/src/serialize.c.o"
  "CMakeFiles/mt_embedding.dir/src/serialize.c.o.d"
  "CMakeFiles/mt_embedding.dir/src/sketch.c.o"
  "CMakeFiles/mt_embedding.dir/src/sketch.c.o.d"
  "CMakeFiles/mt_embedding.dir/src/table.c.o"
  "CMakeFiles/mt_embedding.dir/src/table.c.o.d"
  "libmt_embedding.a"
  "libmt_embedding.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/mt_embedding.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
