// Command atoll is Atoll's command-line tool. `atoll --help` lists every command:
//
//	atoll demo                 the main job: train on an embedded cluster of simulated GPUs
//	atoll topology             print a machine or cluster map (declared spec or discovered)
//	atoll sim                  replay GPU-cluster traces through the gang scheduler
//	atoll head                 run one replica of the Paxos metadata log with its client API
//	atoll bench actors|sched|meta|store|topology
//	                           benchmarks, each against a baseline measured in the same run
package main
