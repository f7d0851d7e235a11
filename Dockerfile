# confshim: a static binary on distroless static:nonroot. `make docker` builds it; `make
# image-test` builds and runs it. No `# syntax=` line: the engine's built-in frontend
# serves every instruction used here (RUN --mount included, Docker 20.10 on), and a syntax
# line would make BuildKit pull a frontend image, which a machine without a registry cannot.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /out/confshim ./cmd/confshim
RUN mkdir -p /out/state && chmod 0700 /out/state

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="confshim" \
      org.opencontainers.image.description="Repairs stale *_conf_version values in APISIX standalone Admin API PUTs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/confshim/confshim"
COPY --from=build /out/confshim /confshim
# --state-dir's usual place, owned by the nonroot user (a named volume copies it)
COPY --from=build --chown=65532:65532 /out/state /var/lib/confshim
USER 65532:65532
EXPOSE 9280 9281
ENTRYPOINT ["/confshim"]
