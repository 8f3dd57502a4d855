"""What the tests share that is not a test: scripted hosts and transports, the planner's
driver, store records, the campaign lab, the flake finder and the CPU profile (the real
test hosts are in `tests/hosts`)."""
