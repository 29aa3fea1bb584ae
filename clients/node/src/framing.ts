// The MessagePack framer that cuts the server's stream into whole
// messages before they are decoded.

import { ProtocolError } from "./errors.js";

/** messageEnd returns the offset just past the MessagePack object that
 * starts at buf[start], or -1 if buf ends before it does. It reads headers
 * only: the server's answers are cut into messages before they are
 * decoded. */
export function messageEnd(buf: Uint8Array, start: number): number {
  let pos = start;
  let need = 1; // objects still to read
  const len = buf.length;
  while (need > 0) {
    if (pos >= len) return -1;
    const b = buf[pos]!;
    need--;
    if (b <= 0x7f || b >= 0xe0) {
      pos += 1;
    } else if (b <= 0x8f) {
      need += 2 * (b & 0x0f);
      pos += 1;
    } else if (b <= 0x9f) {
      need += b & 0x0f;
      pos += 1;
    } else if (b <= 0xbf) {
      pos += 1 + (b & 0x1f);
    } else {
      switch (b) {
        case 0xc0:
        case 0xc2:
        case 0xc3:
          pos += 1;
          break;
        case 0xc4:
        case 0xd9:
          if (pos + 2 > len) return -1;
          pos += 2 + buf[pos + 1]!;
          break;
        case 0xc5:
        case 0xda:
          if (pos + 3 > len) return -1;
          pos += 3 + ((buf[pos + 1]! << 8) | buf[pos + 2]!);
          break;
        case 0xc6:
        case 0xdb:
          if (pos + 5 > len) return -1;
          pos += 5 + u32(buf, pos + 1);
          break;
        case 0xc7:
          if (pos + 2 > len) return -1;
          pos += 3 + buf[pos + 1]!;
          break;
        case 0xc8:
          if (pos + 3 > len) return -1;
          pos += 4 + ((buf[pos + 1]! << 8) | buf[pos + 2]!);
          break;
        case 0xc9:
          if (pos + 5 > len) return -1;
          pos += 6 + u32(buf, pos + 1);
          break;
        case 0xca:
          pos += 5;
          break;
        case 0xcb:
          pos += 9;
          break;
        case 0xcc:
        case 0xd0:
          pos += 2;
          break;
        case 0xcd:
        case 0xd1:
          pos += 3;
          break;
        case 0xce:
        case 0xd2:
          pos += 5;
          break;
        case 0xcf:
        case 0xd3:
          pos += 9;
          break;
        case 0xd4:
          pos += 3;
          break;
        case 0xd5:
          pos += 4;
          break;
        case 0xd6:
          pos += 6;
          break;
        case 0xd7:
          pos += 10;
          break;
        case 0xd8:
          pos += 18;
          break;
        case 0xdc:
          if (pos + 3 > len) return -1;
          need += (buf[pos + 1]! << 8) | buf[pos + 2]!;
          pos += 3;
          break;
        case 0xdd:
          if (pos + 5 > len) return -1;
          need += u32(buf, pos + 1);
          pos += 5;
          break;
        case 0xde:
          if (pos + 3 > len) return -1;
          need += 2 * ((buf[pos + 1]! << 8) | buf[pos + 2]!);
          pos += 3;
          break;
        case 0xdf:
          if (pos + 5 > len) return -1;
          need += 2 * u32(buf, pos + 1);
          pos += 5;
          break;
        default:
          throw new ProtocolError(`fencekv: the server sent the invalid MessagePack byte 0x${b.toString(16)}`);
      }
    }
    if (need > 1e8) throw new ProtocolError("fencekv: the server sent a message with too many elements");
  }
  return pos > len ? -1 : pos;
}

function u32(buf: Uint8Array, i: number): number {
  return ((buf[i]! << 24) >>> 0) + ((buf[i + 1]! << 16) | (buf[i + 2]! << 8) | buf[i + 3]!);
}
