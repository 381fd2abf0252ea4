# README.md and the project's text (tests/docs/check.sh): part of `make test`.
#   make test-docs   README.md at most 250 lines, the results files it names present,
#                    no issue numbers, machine kinds or carried folders in tracked text
.PHONY: test-docs
test: test-docs
test-docs:
	@./tests/docs/check.sh
