// Package snippets is a fixture of internal/lint's snippet checker; it is
// never built (testdata is ignored by the go command).
package snippets

import "fmt"

func ExampleGreet() {
	// A greeting.
	greeting := "hello"
	fmt.Println(greeting)
	// Output: hello
}

func ExampleBye() {
	fmt.Println("bye")
	// Output: bye
}

func ExampleWithArg(s string) {
	fmt.Println(s)
}
