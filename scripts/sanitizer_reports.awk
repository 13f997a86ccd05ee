# Prints the sanitizer reports of an ASan/UBSan test log that are ours, exits 1 if any.
# Every AddressSanitizer error and UBSan "runtime error:" counts. A LeakSanitizer leak counts
# unless every frame below the allocator is inside libcriterion: Criterion's runner keeps one
# 48-byte allocation until exit (libcriterion 2.4.1). A leak allocated by a test body or by
# our code has frames of its own, so it is reported (an LSan suppression of libcriterion
# would hide those too: test bodies are called from libcriterion).
function flush_block() {
  if (inblock && ours) { print block; bad = 1 }
  inblock = 0; ours = 0; block = ""
}
/ERROR: AddressSanitizer|runtime error:/ { flush_block(); print; ctx = 25; bad = 1; next }
ctx > 0 { print; ctx--; next }
/(Direct|Indirect) leak of/ { flush_block(); inblock = 1; block = $0; next }
inblock && /^ *#[0-9]+ / {
  block = block "\n" $0
  if ($1 != "#0" && $0 !~ /libcriterion\.so/) ours = 1
  next
}
inblock { flush_block() }
END { flush_block(); exit bad }
