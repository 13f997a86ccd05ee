
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/embedding/src/changes.c" "embedding/CMakeFiles/mt_embedding.dir/src/changes.c.o" "gcc" "embedding/CMakeFiles/mt_embedding.dir/src/changes.c.o.d"
  "/work/main/embedding/src/optim.c" "embedding/CMakeFiles/mt_embedding.dir/src/optim.c.o" "gcc" "embedding/CMakeFiles/mt_embedding.dir/src/optim.c.o.d"
  "/work/main/embedding/src/serialize.c" "embedding/CMakeFiles/mt_embedding.dir/src/serialize.c.o" "gcc" "embedding/CMakeFiles/mt_embedding.dir/src/serialize.c.o.d"
  "/work/main/embedding/src/sketch.c" "embedding/CMakeFiles/mt_embedding.dir/src/sketch.c.o" "gcc" "embedding/CMakeFiles/mt_embedding.dir/src/sketch.c.o.d"
  "/work/main/embedding/src/table.c" "embedding/CMakeFiles/mt_embedding.dir/src/table.c.o" "gcc" "embedding/CMakeFiles/mt_embedding.dir/src/table.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/common/CMakeFiles/mt_common.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
