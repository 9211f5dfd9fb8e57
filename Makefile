# Entry points; the scripts hold the logic.
.PHONY: setup test conformance

setup:
	./scripts/setup.sh

test:
	./scripts/test.sh

# OpInfo conformance matrix (PyTorch op_db on tpu vs CPU): prints passed/failed/skipped
# per dtype and kind and writes conformance.json. CONFORMANCE_ARGS="--ci" for the CI shard.
conformance:
	python3 scripts/conformance.py $(CONFORMANCE_ARGS)
