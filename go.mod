module github.com/atoll-run/atoll

go 1.26.8

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/spf13/cobra v1.10.2
	github.com/tidwall/wal v1.2.1
	go.uber.org/zap v1.28.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/tidwall/gjson v1.10.2 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.0 // indirect
	github.com/tidwall/tinylru v1.1.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
)
