// Package layer is what a layer author writes against: the interfaces a
// layer implements (Factory, ListenFactory, Filter, MultiLink), the schema
// of its parameters (Param, Args) and the registry (Register) through which
// package vlink finds it by the name a stack gives.
//
// Applications never need this package: they use package vlink, which
// parses stacks and builds them out of registered layers. A layer is one
// package that calls Register from its init function; importing
// github.com/vlink-dev/vlink/vlink/layers registers every layer shipped
// with vlink. The relation is that of database/sql/driver to database/sql.
package layer
