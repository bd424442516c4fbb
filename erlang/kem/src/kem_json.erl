%%% @doc JSON through whichever real library the node has: HyperBEAM's
%%% `hb_json' inside a node, OTP's `json' (OTP 27+), else Debian's
%%% `erlang-jiffy' (OTP 25, our CI). Objects decode to maps with binary keys.
-module(kem_json).
-export([decode/1, encode/1, library/0]).

-spec decode(binary()) -> {ok, term()} | {error, binary()}.
decode(Bin) when is_binary(Bin) ->
    try {ok, do_decode(library(), Bin)}
    catch
        _:_ -> {error, <<"body is not valid JSON">>}
    end.

-spec encode(term()) -> binary().
encode(Term) ->
    case library() of
        hb_json -> hb_json:encode(Term);
        json -> iolist_to_binary(json:encode(Term));
        jiffy -> iolist_to_binary(jiffy:encode(Term))  % iodata for large terms
    end.

%% @doc The library in use: hb_json, json or jiffy.
-spec library() -> hb_json | json | jiffy.
library() ->
    case kem_optional:has(hb_json, decode, 1) of
        true -> hb_json;
        false ->
            case kem_optional:has(json, decode, 1) of
                true -> json;
                false -> jiffy
            end
    end.

do_decode(hb_json, Bin) -> hb_json:decode(Bin);
do_decode(json, Bin) -> json:decode(Bin);
do_decode(jiffy, Bin) -> jiffy:decode(Bin, [return_maps]).
