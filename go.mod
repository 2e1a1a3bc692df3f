module github.com/watermill-inbox/inbox

go 1.24
