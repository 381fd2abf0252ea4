# shim tests (filled in by the shim work)
test-shim:
