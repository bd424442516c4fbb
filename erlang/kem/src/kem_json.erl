%%% @doc JSON through whichever real library the node has: HyperBEAM's
%%% `hb_json' inside a node, OTP's `json' (OTP 27+), else Debian's
%%% `erlang-jiffy' (OTP 25, our CI). Objects decode to maps with binary keys.
%%%
%%% An object with a key twice is refused, `{error, {duplicate_key, Key}}':
%%% a map keeps one of the two silently (the last, in every library here),
%%% so a request could mean one thing to a proxy or a log that reads the
%%% first and another to kem. Decoding watches each object's keys itself:
%%% OTP's `json:decode/3' with an object callback, jiffy without
%%% `return_maps' (objects as key lists) and a walk; hb_json (only inside a
%%% node, which runs OTP 27) is never needed for decoding.
-module(kem_json).
-export([decode/1, encode/1, library/0]).

-spec decode(binary()) -> {ok, term()} | {error, binary() | {duplicate_key, binary()}}.
decode(Bin) when is_binary(Bin) ->
    case long_digits(Bin) of
        true -> {error, <<"body has a run of more than 1024 digits: no number kem reads is that long">>};
        false -> decode_checked(Bin)
    end.

%% A JSON integer is turned into a bignum in time quadratic in its digits
%% (one of 1,000,000 digits, a 1 MB body: 6.8 s of the node's CPU); kem's
%% numbers have at most 20 (2^64), its ids 128 characters. So a body with
%% a longer run of digits anywhere is refused before it is decoded. The
%% look-behind starts a match only where a run starts: without it, 1 MB of
%% 1,024-digit runs took 420 ms to scan, with it 23 ms.
long_digits(Bin) ->
    re:run(Bin, <<"(?<![0-9])[0-9]{1025}">>, [{capture, none}]) =:= match.

decode_checked(Bin) ->
    try {ok, do_decode(decoder(), Bin)}
    catch
        throw:{kem_json_duplicate_key, Key} -> {error, {duplicate_key, Key}};
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

decoder() ->
    case kem_optional:has(json, decode, 3) of
        true -> json;
        false -> jiffy
    end.

do_decode(json, Bin) ->
    Decoders = #{object_push => fun(Key, Value, Acc) -> [{Key, Value} | Acc] end,
                 object_finish => fun(Pairs, Old) -> {object(lists:reverse(Pairs)), Old} end},
    {Value, ok, Rest} = json:decode(Bin, ok, Decoders),
    <<>> = string:trim(Rest, both, " \t\r\n"),  % one value, as json:decode/1
    Value;
do_decode(jiffy, Bin) ->
    maps_of(jiffy:decode(Bin, [])).  % decode/2: the one xref knows (rebar.config)

%% jiffy's objects are `{[{Key, Value}]}' without return_maps.
maps_of({Pairs}) when is_list(Pairs) -> object([{K, maps_of(V)} || {K, V} <- Pairs]);
maps_of(List) when is_list(List) -> [maps_of(V) || V <- List];
maps_of(Value) -> Value.

object(Pairs) ->
    Map = maps:from_list(Pairs),
    case map_size(Map) =:= length(Pairs) of
        true -> Map;
        false -> throw({kem_json_duplicate_key, first_repeated([K || {K, _} <- Pairs], #{})})
    end.

first_repeated([Key | Rest], Seen) ->
    case maps:is_key(Key, Seen) of
        true -> Key;
        false -> first_repeated(Rest, Seen#{Key => true})
    end.

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

duplicate_keys_test() ->
    ?assertEqual({error, {duplicate_key, <<"a">>}}, decode(<<"{\"a\": 1, \"b\": 2, \"a\": 3}">>)),
    ?assertEqual({error, {duplicate_key, <<"k">>}}, decode(<<"[{\"x\": {\"k\": 1, \"k\": 1}}]">>)),
    ?assertEqual({ok, #{<<"a">> => [#{<<"a">> => 1}], <<"b">> => #{}}},
                 decode(<<" {\"a\": [{\"a\": 1}], \"b\": {}} \n">>)),
    ?assertEqual({error, <<"body is not valid JSON">>}, decode(<<"{\"a\": 1} x">>)),
    ?assertEqual({error, <<"body is not valid JSON">>}, decode(<<"{\"a\": ">>)).
-endif.
