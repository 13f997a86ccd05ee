file(REMOVE_RECURSE
  "libmt_embedding.a"
)
