// Package sim drives the gang scheduler core with real cluster traces (Alibaba openb,
// Microsoft ITP, Philly) and reports packing, utilisation, queueing delay and JCT.
package sim
