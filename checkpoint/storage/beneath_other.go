//go:build !unix

package storage

const openNoBlock = 0
