module vramhook.dev/deploy/grafana/gen

go 1.23

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
