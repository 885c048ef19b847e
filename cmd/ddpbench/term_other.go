//go:build !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly

package main

// haveTermios reports false: without termios, no progress bar is drawn.
func haveTermios(uintptr) bool { return false }
