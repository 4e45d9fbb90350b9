#!/usr/bin/env bash
# Regenerates testdata/sys-2socket: a recorded-style sysfs tree of a two-socket GPU server
# (symlinks as the kernel lays them out). Synthesized to follow the layout the kernel uses
# on a real 2-socket server, trimmed to the files discovery reads. Run from topology/testdata.
set -euo pipefail
R=sys-2socket
rm -rf "$R"
mkdir -p "$R"
cd "$R"

node() { # id cpulist memkB
  mkdir -p devices/system/node/node$1
  echo "$2" > devices/system/node/node$1/cpulist
  printf 'Node %s MemTotal:       %s kB\nNode %s MemFree:        1000 kB\n' "$1" "$3" "$1" > devices/system/node/node$1/meminfo
}
node 0 "0-3,8-11" 65856424
node 1 "4-7,12-15" 65998848
mkdir -p devices/system/cpu
echo "0-15" > devices/system/cpu/online

pcidev() { # path vendor class numa [speed width]
  mkdir -p "devices/$1"
  echo "$2" > "devices/$1/vendor"
  echo "$3" > "devices/$1/class"
  echo "$4" > "devices/$1/numa_node"
  if [ $# -ge 6 ]; then
    echo "$5" > "devices/$1/max_link_speed"
    echo "$6" > "devices/$1/max_link_width"
  fi
  mkdir -p bus/pci/devices
  ln -s "../../../devices/$1" "bus/pci/devices/$(basename "$1")"
}
bridge() { pcidev "$1" 0x10b5 0x060400 "$2"; }

# Socket 0: root port 00:01.0 -> PCIe switch (up 01:00.0, down 02:0x.0) -> GPU0, GPU1, IB NIC.
SW=pci0000:00/0000:00:01.0/0000:01:00.0
bridge pci0000:00/0000:00:01.0 0
bridge $SW 0
bridge $SW/0000:02:00.0 0
bridge $SW/0000:02:01.0 0
bridge $SW/0000:02:02.0 0
pcidev $SW/0000:02:00.0/0000:03:00.0 0x10de 0x030200 0 "16.0 GT/s PCIe" 16
pcidev $SW/0000:02:01.0/0000:04:00.0 0x10de 0x030200 0 "16.0 GT/s PCIe" 16
NIC0=$SW/0000:02:02.0/0000:05:00.0
pcidev $NIC0 0x15b3 0x020700 0 "16.0 GT/s PCIe" 16
# Socket 1: GPU2 straight on a root port; an Ethernet NIC; an IB NIC without a netdev.
bridge pci0000:80/0000:80:01.0 1
pcidev pci0000:80/0000:80:01.0/0000:81:00.0 0x10de 0x030000 1 "32.0 GT/s PCIe" 16
bridge pci0000:80/0000:80:02.0 1
pcidev pci0000:80/0000:80:02.0/0000:82:00.0 0x8086 0x020000 1
bridge pci0000:80/0000:80:03.0 1
NIC2=pci0000:80/0000:80:03.0/0000:83:00.0
pcidev $NIC2 0x15b3 0x020700 -1

netdev() { # devpath name speed
  mkdir -p "devices/$1/net/$2" class/net
  ln -s ../../../"$(basename "$1")" "devices/$1/net/$2/device"
  echo "$3" > "devices/$1/net/$2/speed"
  ln -s "../../devices/$1/net/$2" "class/net/$2"
}
netdev $NIC0 ib0 -1
netdev pci0000:80/0000:80:02.0/0000:82:00.0 enp130s0 100000
mkdir -p devices/virtual/net/lo
echo 0 > devices/virtual/net/lo/speed
ln -s ../../devices/virtual/net/lo class/net/lo

ibdev() { # devpath name rate
  mkdir -p "devices/$1/infiniband/$2/ports/1" class/infiniband
  ln -s ../../../"$(basename "$1")" "devices/$1/infiniband/$2/device"
  echo "$3" > "devices/$1/infiniband/$2/ports/1/rate"
  ln -s "../../devices/$1/infiniband/$2" "class/infiniband/$2"
}
ibdev $NIC0 mlx5_0 "400 Gb/sec (4X NDR)"
ibdev $NIC2 mlx5_1 "200 Gb/sec (4X HDR)"
