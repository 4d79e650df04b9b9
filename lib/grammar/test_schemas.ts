// Test-only: a dozen JSON schemas for structured-output tests (nested objects, bounded arrays,
// enums, numbers, anyOf, $ref, required and optional fields), shared by lib/grammar's tests and the
// HTTP tests. Strings carry maxLength and integers bounds: a demo model (random-ish text) otherwise
// runs on inside a number or string for hundreds of tokens; bounds make its outputs end. The
// engine bounds integers only, so fractional numbers appear unbounded in FLOATS only
// (random-logit tests, whose bias ends them).

/** Schemas by name. */
export const SCHEMAS: Record<string, unknown> = {
  person: {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 12 },
      age: { type: "integer", minimum: 0, maximum: 99 },
    },
    required: ["name", "age"],
    additionalProperties: false,
  },
  optional_fields: {
    type: "object",
    properties: {
      id: { type: "integer", minimum: 0, maximum: 9999 },
      nickname: { type: "string", maxLength: 8 },
      verified: { type: "boolean" },
    },
    required: ["id"],
    additionalProperties: false,
  },
  nested: {
    type: "object",
    properties: {
      user: {
        type: "object",
        properties: {
          name: { type: "string", maxLength: 10 },
          address: {
            type: "object",
            properties: {
              city: { type: "string", maxLength: 10 },
              zip: { type: "string", pattern: "^[0-9]{5}$" },
            },
            required: ["city", "zip"],
            additionalProperties: false,
          },
        },
        required: ["name", "address"],
        additionalProperties: false,
      },
    },
    required: ["user"],
    additionalProperties: false,
  },
  bounded_array: {
    type: "object",
    properties: {
      tags: { type: "array", items: { type: "string", maxLength: 6 }, minItems: 2, maxItems: 4 },
    },
    required: ["tags"],
    additionalProperties: false,
  },
  enums: {
    type: "object",
    properties: {
      color: { enum: ["red", "green", "blue"] },
      size: { type: "string", enum: ["S", "M", "L", "XL"] },
      level: { enum: [1, 2, 3] },
    },
    required: ["color", "size", "level"],
    additionalProperties: false,
  },
  numbers: {
    type: "object",
    properties: {
      price: { type: "integer", minimum: 0, maximum: 999 },
      count: { type: "integer", minimum: 0, maximum: 99 },
      ratio: { type: "integer", minimum: -9, maximum: 9 },
    },
    required: ["price", "count", "ratio"],
    additionalProperties: false,
  },
  any_of: {
    type: "object",
    properties: {
      value: {
        anyOf: [{ type: "integer", minimum: -99, maximum: 99 }, { type: "string", maxLength: 5 }, {
          type: "null",
        }],
      },
    },
    required: ["value"],
    additionalProperties: false,
  },
  array_of_objects: {
    type: "array",
    items: {
      type: "object",
      properties: {
        x: { type: "integer", minimum: -99, maximum: 99 },
        y: { type: "integer", minimum: -99, maximum: 99 },
      },
      required: ["x", "y"],
      additionalProperties: false,
    },
    minItems: 1,
    maxItems: 3,
  },
  const_and_bool: {
    type: "object",
    properties: { kind: { const: "event" }, ok: { type: "boolean" }, note: { type: "null" } },
    required: ["kind", "ok", "note"],
    additionalProperties: false,
  },
  refs: {
    type: "object",
    $defs: {
      point: {
        type: "object",
        properties: {
          lat: { type: "integer", minimum: -99, maximum: 99 },
          lon: { type: "integer", minimum: -999, maximum: 999 },
        },
        required: ["lat", "lon"],
        additionalProperties: false,
      },
    },
    properties: { from: { $ref: "#/$defs/point" }, to: { $ref: "#/$defs/point" } },
    required: ["from", "to"],
    additionalProperties: false,
  },
  matrix: {
    type: "object",
    properties: {
      rows: {
        type: "array",
        items: {
          type: "array",
          items: { type: "integer", minimum: 0, maximum: 9 },
          minItems: 1,
          maxItems: 3,
        },
        minItems: 1,
        maxItems: 2,
      },
    },
    required: ["rows"],
    additionalProperties: false,
  },
  any_of_objects: {
    type: "object",
    properties: {
      shape: {
        anyOf: [
          {
            type: "object",
            properties: { circle: { type: "integer", minimum: 0, maximum: 9 } },
            required: ["circle"],
            additionalProperties: false,
          },
          {
            type: "object",
            properties: {
              w: { type: "integer", minimum: 0, maximum: 99 },
              h: { type: "integer", minimum: 0, maximum: 99 },
            },
            required: ["w", "h"],
            additionalProperties: false,
          },
        ],
      },
      label: { type: "string", maxLength: 6 },
    },
    required: ["shape"],
    additionalProperties: false,
  },
};

/** Unbounded fractional numbers (lib/grammar's random-logit test only). */
export const FLOATS = {
  type: "object",
  properties: {
    x: { type: "number" },
    y: { type: "number" },
    label: { type: "string", maxLength: 4 },
  },
  required: ["x", "y"],
  additionalProperties: false,
};
