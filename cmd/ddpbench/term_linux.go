package main

import "golang.org/x/sys/unix"

func haveTermios(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}
