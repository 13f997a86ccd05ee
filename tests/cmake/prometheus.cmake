# deploy/prometheus: the scrape configuration and the alert rules are valid, and every alert
# fires where it should and not where it should not (promtool, from Debian's prometheus).
find_program(MT_PROMTOOL promtool)
if(MT_PROMTOOL)
  add_test(NAME test_prometheus_rules COMMAND bash -c "\
set -e; cd ${CMAKE_SOURCE_DIR}/deploy/prometheus; \
${MT_PROMTOOL} check config prometheus.yml; \
${MT_PROMTOOL} check rules alerts.yml; \
${MT_PROMTOOL} test rules alerts_test.yml")
else()
  add_test(NAME test_prometheus_rules
    COMMAND sh -c "echo 'test_prometheus_rules: promtool missing: bash scripts/setup.sh (prometheus)' >&2; exit 1")
endif()
