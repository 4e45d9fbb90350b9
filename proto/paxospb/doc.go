// Package paxospb holds the Go generated from proto/paxos.proto: the frames replicas of the
// metadata log exchange (store/paxos's TCP transport) and its WAL records. Regenerate with
// `protoc --go_out=. --go_opt=module=github.com/atoll-run/atoll proto/*.proto`;
// scripts/check-proto.sh (run by CI) fails when this code is out of date.
package paxospb
