module github.com/watermill-inbox/inbox/metrics/dashboard

go 1.24.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
