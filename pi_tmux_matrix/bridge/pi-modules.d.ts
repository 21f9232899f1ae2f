// The two packages the bridge imports that pi's loader provides (it maps their names to its own
// bundled copies: nothing is installed beside the bridge), declared for the type check with only
// what the bridge uses. A script, not a module: these are ambient declarations of other modules.

declare module "typebox" {
  /** A JSON schema built by typebox (pi checks a tool's arguments against it). */
  type Schema = { readonly [key: string]: unknown };
  type Options = { description?: string };
  export const Type: {
    Object(properties: Record<string, Schema>, options?: Options): Schema;
    String(options?: Options): Schema;
    Number(options?: Options): Schema;
    Boolean(options?: Options): Schema;
    Array(items: Schema, options?: Options): Schema;
    Optional(schema: Schema): Schema;
  };
}

declare module "@mariozechner/pi-tui" {
  /** pi-tui's text component (a tool's call and result lines). */
  export class Text {
    constructor(text?: string, paddingX?: number, paddingY?: number);
  }
}
