common/CMakeFiles/mt_common.dir/src/err.c.o: /work/main/common/src/err.c \
 /usr/include/stdc-predef.h /work/main/common/include/mt/err.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stddef.h
