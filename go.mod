module github.com/watermill-inbox/inbox

go 1.24

require github.com/ThreeDotsLabs/watermill v1.5.1

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
)
