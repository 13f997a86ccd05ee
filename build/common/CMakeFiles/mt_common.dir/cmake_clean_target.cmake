file(REMOVE_RECURSE
  "libmt_common.a"
)
