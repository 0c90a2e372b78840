// JSON Schema to grammar (grammar/json_schema.h): documents the schema accepts are
// sentences, documents it refuses are not, random sentences parse and keep every
// constraint, integer ranges hold exactly, and what is not supported is an error
// naming the keyword and its place.
#include <random>

#include "gmock/gmock.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/grammar/byte_vocabulary.h"
#include "tests/grammar/random_sentence.h"

namespace ps::grammar {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const Vocabulary> Bytes() {
  static const auto* v = new std::shared_ptr<const Vocabulary>(testing::ByteVocabulary());
  return *v;
}

std::shared_ptr<const CompiledGrammar> FromSchema(const Json& schema) {
  absl::StatusOr<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status();
  absl::StatusOr<Grammar> g = Grammar::FromGbnf(*gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << *gbnf;
  return std::make_shared<const CompiledGrammar>(*std::move(g));
}

bool Accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view doc) {
  Matcher m(g, Bytes());
  return m.AcceptBytes(doc) && m.CanEnd();
}

std::string RandomSentence(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng) {
  return testing::RandomSentence(g, Bytes(), rng, "\"}],");
}

// The issue's nested schema: an object with an enum, an integer range, an array of
// objects, required and optional properties.
const Json kPerson = Json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20},
    "role": {"enum": ["admin", "user", "guest"]},
    "age": {"type": "integer", "minimum": 18, "maximum": 65},
    "pets": {"type": "array", "maxItems": 3, "items": {
      "type": "object",
      "properties": {"kind": {"type": "string", "enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0}},
      "required": ["kind"]}},
    "nickname": {"type": ["string", "null"]},
    "verified": {"type": "boolean"}
  },
  "required": ["name", "role", "age"],
  "additionalProperties": false
})");

TEST(JsonSchema, NestedSchemaAcceptsWhatItShould) {
  auto g = FromSchema(kPerson);
  for (const char* ok : {
           R"({"name": "Ann", "role": "admin", "age": 30})",
           R"({"name":"B","role":"user","age":18,"pets":[],"verified":true})",
           "{\n  \"name\": \"Cé数\",\n  \"role\": \"guest\",\n  \"age\": 65,\n  \"pets\": [{\"kind\": \"dog\", "
           "\"legs\": 4}, {\"kind\": \"cat\"}],\n  \"nickname\": null\n}",
           R"({"name": "x", "role": "user", "age": 40, "nickname": "\"q\"\u00e9"})",
       }) {
    EXPECT_TRUE(Accepts(g, ok)) << ok;
  }
  for (
      const char* bad : {
          R"({"name": "Ann", "role": "admin"})",                                    // age missing
          R"({"name": "Ann", "role": "root", "age": 30})",                          // not in the enum
          R"({"name": "Ann", "role": "admin", "age": 17})",                         // below the range
          R"({"name": "Ann", "role": "admin", "age": 66})",                         // above it
          R"({"name": "Ann", "role": "admin", "age": 30.5})",                       // not an integer
          R"({"name": "", "role": "admin", "age": 30})",                            // shorter than minLength
          R"({"name": "Ann", "role": "admin", "age": 30, "x": 1})",                 // additionalProperties: false
          R"({"name": "Ann", "role": "admin", "age": 30, "pets": [{"legs": 4}]})",  // kind missing
          R"({"name": "Ann", "role": "admin", "age": 30, "pets": [{"kind": "cat"},{"kind": "cat"},{"kind": "cat"},{"kind": "cat"}]})",
          R"({"name": "Ann", "role": "admin", "age": 30,})",         // trailing comma
          "{\"name\": \"a\nb\", \"role\": \"admin\", \"age\": 30}",  // raw control character
      }) {
    EXPECT_FALSE(Accepts(g, bad)) << bad;
  }
}

TEST(JsonSchema, RandomSentencesParseAndKeepTheConstraints) {
  auto g = FromSchema(kPerson);
  std::mt19937 rng(11);
  int finished = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string doc = RandomSentence(g, rng);
    if (doc.empty()) continue;
    ++finished;
    const Json j = Json::parse(doc, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << doc;
    ASSERT_TRUE(j.is_object()) << doc;
    for (const char* key : {"name", "role", "age"}) ASSERT_TRUE(j.contains(key)) << doc;
    for (const auto& [key, v] : j.items()) {
      EXPECT_TRUE(kPerson["properties"].contains(key)) << doc;
    }
    EXPECT_GE(j["name"].get<std::string>().size(), 1u);
    EXPECT_THAT(j["role"].get<std::string>(), ::testing::AnyOf("admin", "user", "guest"));
    ASSERT_TRUE(j["age"].is_number_integer()) << doc;
    EXPECT_GE(j["age"].get<int>(), 18);
    EXPECT_LE(j["age"].get<int>(), 65);
    if (j.contains("pets")) {
      EXPECT_LE(j["pets"].size(), 3u) << doc;
      for (const Json& p : j["pets"]) {
        EXPECT_THAT(p["kind"].get<std::string>(), ::testing::AnyOf("cat", "dog"));
        if (p.contains("legs")) {
          EXPECT_GE(p["legs"].get<int64_t>(), 0);
        }
      }
    }
    if (j.contains("nickname")) {
      EXPECT_TRUE(j["nickname"].is_string() || j["nickname"].is_null());
    }
    if (j.contains("verified")) {
      EXPECT_TRUE(j["verified"].is_boolean());
    }
  }
  EXPECT_GE(finished, 150);
}

TEST(JsonSchema, IntegerRangesAreExact) {
  struct Range {
    Json schema;
    std::function<bool(int)> in;
  };
  const Range ranges[] = {
      {{{"type", "integer"}, {"minimum", -123}, {"maximum", 4567}}, [](int i) { return i >= -123 && i <= 4567; }},
      {{{"type", "integer"}, {"minimum", 5}, {"maximum", 12}}, [](int i) { return i >= 5 && i <= 12; }},
      {{{"type", "integer"}, {"exclusiveMinimum", 0}, {"exclusiveMaximum", 100}},
       [](int i) { return i > 0 && i < 100; }},
      {{{"type", "integer"}, {"minimum", 7}}, [](int i) { return i >= 7; }},
      {{{"type", "integer"}, {"maximum", -3}}, [](int i) { return i <= -3; }},
      {{{"type", "integer"}, {"minimum", -5.5}, {"maximum", 99.5}}, [](int i) { return i >= -5 && i <= 99; }},
      {{{"type", "integer"}, {"minimum", -20}, {"maximum", -10}}, [](int i) { return i >= -20 && i <= -10; }},
  };
  for (const Range& r : ranges) {
    auto g = FromSchema(r.schema);
    int wrong = 0;
    for (int i = -12000; i <= 12000; ++i) {
      if (Accepts(g, std::to_string(i)) != r.in(i) && ++wrong <= 3) ADD_FAILURE() << r.schema.dump() << " at " << i;
    }
    EXPECT_EQ(wrong, 0) << r.schema.dump();
    EXPECT_FALSE(Accepts(g, "007")) << r.schema.dump();  // no leading zeros
    EXPECT_FALSE(Accepts(g, "-0")) << r.schema.dump();
  }
}

TEST(JsonSchema, RefsFormatsAndAlternatives) {
  auto tree = FromSchema(Json::parse(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}})"));
  EXPECT_TRUE(Accepts(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": -4, "kids": []}]}]})"));
  EXPECT_FALSE(Accepts(tree, R"({"v": 1, "kids": [{"w": 2}]})"));
  auto when = FromSchema(Json::parse(R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
      "t": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}},
      "required": ["d", "t", "id"]})"));
  EXPECT_TRUE(Accepts(
      when, R"({"d": "2026-11-28", "t": "2026-11-28T01:02:03.5Z", "id": "123e4567-e89b-12d3-a456-426614174000"})"));
  EXPECT_FALSE(Accepts(
      when, R"({"d": "2026-13-28", "t": "2026-11-28T01:02:03Z", "id": "123e4567-e89b-12d3-a456-426614174000"})"));
  auto either = FromSchema(Json::parse(
      R"({"anyOf": [{"type": "integer"}, {"const": {"k": [1, "two"]}}, {"type": "array", "minItems": 2, "items": {"type": "boolean"}}]})"));
  for (const char* ok : {"12", R"({"k":[1,"two"]})", "[true, false]", "[true,false,true]"})
    EXPECT_TRUE(Accepts(either, ok)) << ok;
  for (const char* bad : {"1.5", R"({"k":[1,"three"]})", "[true]", "null"}) EXPECT_FALSE(Accepts(either, bad)) << bad;
  auto any = FromSchema(Json::parse(R"({"type": "object"})"));
  EXPECT_TRUE(Accepts(any, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(Accepts(any, "[1]"));
  auto extra = FromSchema(
      Json::parse(R"({"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}})"));
  EXPECT_TRUE(Accepts(extra, R"({"a": 1, "b": "x", "c": "y"})"));
  EXPECT_TRUE(Accepts(extra, R"({"b": "x"})"));
  EXPECT_FALSE(Accepts(extra, R"({"a": 1, "b": 2})"));
}

TEST(JsonSchema, APatternHoldsTheStringsCharacters) {
  const auto g = FromSchema(Json::parse(R"({"type": "object", "properties": {
      "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
      "tag": {"type": "string", "pattern": "ab+"}}, "required": ["zip", "tag"]})"));
  EXPECT_TRUE(Accepts(g, R"({"zip": "12345", "tag": "ab"})"));
  EXPECT_TRUE(Accepts(g, R"({"zip": "12345-6789", "tag": "xx abbb yy"})"));  // unanchored: anywhere
  EXPECT_FALSE(Accepts(g, R"({"zip": "1234", "tag": "ab"})"));
  EXPECT_FALSE(Accepts(g, R"({"zip": "12345 ", "tag": "ab"})"));
  EXPECT_FALSE(Accepts(g, R"({"zip": "12345", "tag": "a"})"));
}

TEST(JsonSchema, WhatIsNotSupportedIsAnErrorNamingIt) {
  auto error = [](const char* schema) {
    absl::StatusOr<std::string> g = JsonSchemaToGbnf(Json::parse(schema));
    EXPECT_FALSE(g.ok()) << schema;
    return std::string(g.status().message());
  };
  EXPECT_THAT(error(R"({"type": "object", "properties": {"a": {"type": "object", "minProperties": 1}}})"),
              ::testing::HasSubstr("properties.a.minProperties: this keyword is not supported"));
  EXPECT_THAT(error(R"js({"type": "string", "pattern": "a(?=b)"})js"),
              ::testing::HasSubstr("at pattern: at offset 1: '(?' (lookaround, named groups, flags) is not supported"));
  EXPECT_THAT(error(R"({"type": "string", "pattern": "^a$", "maxLength": 3})"),
              ::testing::HasSubstr("maxLength: next to a pattern is not supported"));
  EXPECT_THAT(error(R"({"type": "number", "minimum": 1})"), ::testing::HasSubstr("bounds on a number"));
  EXPECT_THAT(error(R"({"type": "string", "format": "email"})"), ::testing::HasSubstr("supported formats"));
  EXPECT_THAT(error(R"({"$ref": "#/$defs/missing"})"), ::testing::HasSubstr("does not name a schema"));
  EXPECT_THAT(error(R"({"type": "integer", "minimum": 10, "maximum": 5})"), ::testing::HasSubstr("no integer"));
  EXPECT_THAT(error(R"({"type": "array", "maxItems": 5000})"), ::testing::HasSubstr("above 1000"));
  EXPECT_THAT(error(R"({"type": "text"})"), ::testing::HasSubstr("'text' is not a JSON Schema type"));
  EXPECT_THAT(error(R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})"), ::testing::HasSubstr("allOf"));
  EXPECT_THAT(error("false"), ::testing::HasSubstr("accepts nothing"));
  std::string deep = "{}";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_THAT(error(deep.c_str()), ::testing::HasSubstr("nested too deeply"));
}

}  // namespace
}  // namespace ps::grammar
