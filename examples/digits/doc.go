// Command digits runs the digits training example (package digits, the same program as
// `atoll demo`) on an embedded Atoll cluster of simulated GPU machines.
package main
