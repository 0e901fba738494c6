# Thin wrappers over the plain commands in the README and docs/.
.PHONY: run test test-race vet fmt ci build bench images up down

run: ## the whole service in one process, on an embedded JetStream, with a demo raven
	go run ./cmd/dispatcher -standalone

test:
	go test ./...

test-race:
	go test -race ./...

vet:
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

ci: ## what CI runs
	bash .ci/run

build: ## static binaries in bin/
	CGO_ENABLED=0 go build -o bin/ ./cmd/...

bench: ## the benchmark table (several minutes); BENCHMARKS.md records one run
	go run ./cmd/bench

images: ## images FROM scratch, no registry needed (IMAGE_TAG, default dev)
	bash deployments/images.sh

COMPOSE ?= $(shell command -v docker-compose >/dev/null 2>&1 && echo docker-compose || echo docker compose)

up: images ## the compose stack: 3-node NATS cluster, 2 ingest, 2 dispatchers, demo raven
	$(COMPOSE) up -d

down: ## stop the compose stack and delete its volumes
	$(COMPOSE) down -v
